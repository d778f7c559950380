// The driver loader: a missing library, a library that is not a CUDA 12+ driver, and a fake
// driver (tests/cuda/fake_cuda_driver.cc) that fails the way real ones do; then the real
// driver where there is one.
#include "cuda/driver/cuda_driver.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>

#include "cuda/driver/cuda_errors.h"
#include "cuda/driver/dl_library.h"
#include "tests/cuda/cuda_test_util.h"

namespace baton {
namespace {

TEST(DlLibraryTest, MissingLibraryIsUnavailableWithDlerror) {
  Result<DlLibrary> lib = DlLibrary::Open("libbaton-does-not-exist.so.7");
  ASSERT_FALSE(lib.ok());
  EXPECT_EQ(lib.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(lib.status().message().rfind("libbaton-does-not-exist.so.7: ", 0), 0u)
      << lib.status().message();
  EXPECT_NE(lib.status().message().find("No such file"), std::string::npos)
      << lib.status().message();
}

TEST(DlLibraryTest, FindsSymbolsAndMoves) {
  Result<DlLibrary> lib = DlLibrary::Open("libm.so.6");
  ASSERT_TRUE(lib.ok()) << lib.status().ToString();
  EXPECT_NE(lib->Symbol("cos"), nullptr);
  EXPECT_EQ(lib->Symbol("baton_no_such_symbol"), nullptr);
  DlLibrary moved = std::move(lib).value();
  EXPECT_TRUE(moved.valid());
  EXPECT_NE(moved.Symbol("sin"), nullptr);
}

TEST(CudaErrorsTest, StickyErrorsAndCodes) {
  for (int sticky :
       {214, 220, 226, 700, 702, 709, 710, 714, 715, 716, 717, 718, 719, 721, 911, 999}) {
    EXPECT_TRUE(IsStickyCudaError(sticky)) << sticky;
    EXPECT_EQ(CudaStatusCode(sticky), StatusCode::kInternal) << sticky;
  }
  for (int plain : {0, 1, 2, 35, 100, 201, 600, 801})
    EXPECT_FALSE(IsStickyCudaError(plain)) << plain;
  EXPECT_EQ(CudaStatusCode(0), StatusCode::kOk);
  EXPECT_EQ(CudaStatusCode(2), StatusCode::kResourceExhausted);
  EXPECT_EQ(CudaStatusCode(100), StatusCode::kUnavailable);
  EXPECT_EQ(CudaStatusCode(1), StatusCode::kInvalidArgument);
  EXPECT_EQ(CudaErrorFallbackName(700), "CUDA_ERROR_ILLEGAL_ADDRESS");
  EXPECT_EQ(CudaErrorFallbackName(4242), "CUresult 4242");
}

#ifdef BATON_HAVE_CUDA_HEADERS

// Loads the fake driver with $BATON_FAKE_CUDA set to `mode`, then puts back what it was: the
// tests that follow may run on the emulated device, which reads it at every call.
Result<std::unique_ptr<CudaDriver>> LoadFake(const char* mode) {
  const char* was = ::getenv("BATON_FAKE_CUDA");
  const std::string before = was != nullptr ? was : "";
  ::setenv("BATON_FAKE_CUDA", mode, 1);
  Result<std::unique_ptr<CudaDriver>> driver = CudaDriver::Load(
      CudaDriverOptions{.library = testing::LibDir() + "/libbaton_fake_cuda_driver.so"});
  if (was != nullptr) {
    ::setenv("BATON_FAKE_CUDA", before.c_str(), 1);
  } else {
    ::unsetenv("BATON_FAKE_CUDA");
  }
  return driver;
}

TEST(CudaDriverTest, MissingDriverNamesTheLibrary) {
  Result<std::unique_ptr<CudaDriver>> d =
      CudaDriver::Load(CudaDriverOptions{.library = "/nonexistent/libcuda.so.1"});
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(d.status().message().rfind("/nonexistent/libcuda.so.1: ", 0), 0u)
      << d.status().message();
}

TEST(CudaDriverTest, LibraryWithoutGetProcAddressIsRefused) {
  Result<std::unique_ptr<CudaDriver>> d =
      CudaDriver::Load(CudaDriverOptions{.library = "libm.so.6"});
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("no cuGetProcAddress_v2"), std::string::npos)
      << d.status().message();
}

TEST(CudaDriverTest, FailingCuInitIsNamed) {
  Result<std::unique_ptr<CudaDriver>> d = LoadFake("no_device");
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(d.status().message(),
            "cuInit: CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)");
}

TEST(CudaDriverTest, MissingEntryPointIsNamed) {
  Result<std::unique_ptr<CudaDriver>> d = LoadFake("missing:cuMemCreate");
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("does not provide cuMemCreate"), std::string::npos)
      << d.status().message();
}

TEST(CudaDriverTest, EntryPointNeedingANewerDriverIsNamed) {
  Result<std::unique_ptr<CudaDriver>> d = LoadFake("old:cuMemExportToShareableHandle");
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("too old for cuMemExportToShareableHandle (needs the CUDA "
                                      "10.2 API)"),
            std::string::npos)
      << d.status().message();
}

TEST(CudaDriverTest, DriverOlderThan12IsRefused) {
  Result<std::unique_ptr<CudaDriver>> d = LoadFake("old_driver");
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("driver version 11.8 is older than 12.0"), std::string::npos)
      << d.status().message();
}

TEST(CudaDriverTest, WorkingDriverResolvesEverythingAndNamesErrors) {
  Result<std::unique_ptr<CudaDriver>> d = LoadFake("ok");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  const CudaDriver& cu = **d;
  EXPECT_EQ(cu.version(), 12040);
  EXPECT_EQ(cu.version_string(), "12.4");
  EXPECT_EQ(cu.device_count(), 0);
#define BATON_EXPECT_RESOLVED(fn, version) EXPECT_NE(cu.api().fn, nullptr) << #fn;
  BATON_CUDA_DRIVER_FUNCTIONS(BATON_EXPECT_RESOLVED)
#undef BATON_EXPECT_RESOLVED
  EXPECT_TRUE(cu.Check(CUDA_SUCCESS, "cuMemCreate").ok());
  Status oom = cu.Check(CUDA_ERROR_OUT_OF_MEMORY, "cuMemCreate");
  EXPECT_EQ(oom.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(oom.message(), "cuMemCreate: CUDA_ERROR_OUT_OF_MEMORY (out of memory)");
  Status sticky = cu.Check(CUDA_ERROR_ILLEGAL_ADDRESS, "cuStreamQuery");
  EXPECT_EQ(sticky.code(), StatusCode::kInternal);
  // The fake knows no name for this one: the built-in table is the fallback.
  EXPECT_EQ(cu.Check(CUDA_ERROR_LAUNCH_FAILED, "cuLaunchKernel").message(),
            "cuLaunchKernel: CUDA_ERROR_LAUNCH_FAILED");
  EXPECT_EQ(cu.ErrorName(static_cast<CUresult>(4242)), "CUresult 4242");
}

TEST(CudaDriverTest, ProcessDriverLoadsOrSaysWhy) {
  Result<const CudaDriver*> cu = CudaDriver::Get();
  if (!cu.ok()) {
    EXPECT_EQ(cu.status().code(), StatusCode::kUnavailable) << cu.status().ToString();
    EXPECT_FALSE(cu.status().message().empty());
    GTEST_SKIP() << "no CUDA driver: " << cu.status().message();
  }
  EXPECT_GE((*cu)->version(), 12000);
  // The same outcome every time.
  EXPECT_EQ(*CudaDriver::Get(), *cu);
}

#endif  // BATON_HAVE_CUDA_HEADERS

}  // namespace
}  // namespace baton
