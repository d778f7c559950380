// The start-up choice of memory backend, on whatever machine runs the test: without a usable
// GPU, "auto" is the host backend with the reason and "cuda" is an error; with one, "auto"
// is the CUDA backend.
#include "cuda/driver/gpu_backend.h"

#include <gtest/gtest.h>

#ifdef BATON_HAVE_CUDA_HEADERS
#include "cuda/driver/cuda_driver.h"
#endif

namespace baton {
namespace {

bool GpuUsable() {
#ifdef BATON_HAVE_CUDA_HEADERS
  Result<const CudaDriver*> cu = CudaDriver::Get();
  return cu.ok() && (*cu)->device_count() > 0;
#else
  return false;
#endif
}

TEST(GpuBackendTest, ParsesModes) {
  EXPECT_EQ(*ParseBackendMode("auto"), BackendMode::kAuto);
  EXPECT_EQ(*ParseBackendMode("host"), BackendMode::kHost);
  EXPECT_EQ(*ParseBackendMode("cuda"), BackendMode::kCuda);
  Result<BackendMode> bad = ParseBackendMode("gpu");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "backend must be auto, host or cuda, got 'gpu'");
  EXPECT_STREQ(ToString(BackendMode::kCuda), "cuda");
}

TEST(GpuBackendTest, HostWhenConfigured) {
  Result<BackendChoice> c = ChooseMemoryBackend({.mode = BackendMode::kHost});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->kind, MemoryBackendKind::kHost);
  EXPECT_EQ(c->LogLine(), "backend: host (configured)");
}

TEST(GpuBackendTest, AutoPicksWhatTheMachineHas) {
  Result<BackendChoice> c = ChooseMemoryBackend({.mode = BackendMode::kAuto});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  if (GpuUsable()) {
    EXPECT_EQ(c->kind, MemoryBackendKind::kCuda) << c->LogLine();
    EXPECT_EQ(c->LogLine().rfind("backend: cuda (device 0 ", 0), 0u) << c->LogLine();
  } else {
    EXPECT_EQ(c->kind, MemoryBackendKind::kHost);
    EXPECT_FALSE(c->reason.empty());
    EXPECT_EQ(c->LogLine(), "backend: host (" + c->reason + ")");
  }
}

TEST(GpuBackendTest, ConfiguredCudaWithoutAGpuIsAnError) {
  if (GpuUsable()) GTEST_SKIP() << "a GPU is usable here";
  Result<BackendChoice> c = ChooseMemoryBackend({.mode = BackendMode::kCuda});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("backend cuda was configured but cannot be used"),
            std::string::npos)
      << c.status().message();
}

TEST(GpuBackendTest, MissingDeviceIsRefused) {
  if (!GpuUsable()) GTEST_SKIP() << "no CUDA driver: no usable GPU";
  Result<BackendChoice> c = ChooseMemoryBackend({.mode = BackendMode::kCuda, .device = 1000});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("CUDA device 1000 does not exist"), std::string::npos);
}

TEST(GpuBackendTest, DescribesCudaErrors) {
  EXPECT_EQ(DescribeCudaError(0), "CUDA_SUCCESS");
  EXPECT_EQ(DescribeCudaError(700).rfind("CUDA_ERROR_ILLEGAL_ADDRESS", 0), 0u)
      << DescribeCudaError(700);
}

}  // namespace
}  // namespace baton
