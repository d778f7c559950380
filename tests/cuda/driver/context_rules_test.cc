// What the CUDA driver refuses about contexts and modules among the calls Baton makes, asserted
// through the driver itself (as tests/cuda/memory/vmm_driver_rules_test.cc does for memory):
// on a GPU host against the real driver, on the fake driver's emulated device
// (cuda_gpu_tests_on_emulated_device) against the emulation, so that code which forgets to
// make its context current on a thread fails in `make test` as it would on a GPU. What only
// the emulation models (the primary context's end) is asserted only there. Skipped without a
// GPU or the emulated device.
#include <gtest/gtest.h>

#include "tests/cuda/cuda_test_util.h"

#ifdef BATON_HAVE_CUDA_HEADERS

#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>

#include "cuda/kernels/kernels_ptx.h"

namespace baton {
namespace {

bool Emulated() {
  const char* mode = std::getenv("BATON_FAKE_CUDA");
  return mode != nullptr && std::strcmp(mode, "vmm") == 0;
}

TEST(VmmContextRulesTest, AThreadWithNoCurrentContextIsRefused) {
  BATON_CUDA_OR_SKIP(ctx);
  const CudaDriver& cu = ctx.driver();
  CUresult alloc = CUDA_SUCCESS;
  CUresult stream = CUDA_SUCCESS;
  CUresult info = CUDA_SUCCESS;
  CUresult after = CUDA_ERROR_UNKNOWN;
  void* p = nullptr;
  std::thread([&] {
    alloc = cu->cuMemAllocHost(&p, 4096);
    CUstream s = nullptr;
    stream = cu->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
    size_t free_bytes = 0, total = 0;
    info = cu->cuMemGetInfo(&free_bytes, &total);
    if (ctx.MakeCurrent().ok()) after = cu->cuMemAllocHost(&p, 4096);
  }).join();
  EXPECT_EQ(alloc, CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(stream, CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(info, CUDA_ERROR_INVALID_CONTEXT);
  ASSERT_EQ(after, CUDA_SUCCESS) << "with the context made current";
  EXPECT_EQ(cu->cuMemFreeHost(p), CUDA_SUCCESS);
}

TEST(VmmContextRulesTest, AKernelTheModuleLacksIsNotFound) {
  BATON_CUDA_OR_SKIP(ctx);
  Result<Module> module = Module::LoadPtx(ctx.driver(), kBatonKernelsPtx);
  ASSERT_TRUE(module.ok()) << module.status().ToString();
  EXPECT_TRUE(module->Function(kScrubHeadersKernel).ok());
  CUfunction f = nullptr;
  EXPECT_EQ(ctx.driver()->cuModuleGetFunction(&f, module->get(), "baton_no_such_kernel"),
            CUDA_ERROR_NOT_FOUND);
}

TEST(VmmContextRulesTest, ThePrimaryContextsLastReleaseEndsWhatItHeld) {
  BATON_CUDA_OR_SKIP(ctx);
  if (!Emulated()) GTEST_SKIP() << "releasing the primary context would end the other tests'";
  const CudaDriver& cu = ctx.driver();
  void* p = nullptr;
  ASSERT_EQ(cu->cuMemAllocHost(&p, 4096), CUDA_SUCCESS);
  { PrimaryContext last = std::move(ctx); }  // the last retain: still current here, but gone
  EXPECT_EQ(cu->cuMemFreeHost(p), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  Result<PrimaryContext> again = PrimaryContext::Retain(cu, 0);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_NE(cu->cuMemFreeHost(p), CUDA_SUCCESS) << "the buffer went with the old context";
  { PrimaryContext released = std::move(again).value(); }
  EXPECT_NE(cu->cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS) << "released more than retained";
}

}  // namespace
}  // namespace baton

#endif  // BATON_HAVE_CUDA_HEADERS
