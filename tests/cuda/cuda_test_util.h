// Helpers shared by the CUDA backend's tests: the GPU-or-skip guard and temporary directories.
//
// BATON_CUDA_OR_SKIP(ctx) retains device 0's primary context into `ctx`, or skips the test
// with "no CUDA driver: <why>" where there is no usable GPU (no libcuda, no device), so that
// the same test binary passes on every machine and runs for real on a GPU host.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>

#ifdef BATON_HAVE_CUDA_HEADERS
#include "cuda/cuda_driver.h"
#include "cuda/cuda_handles.h"

#define BATON_CUDA_OR_SKIP(ctx)                                                          \
  ::baton::Result<const ::baton::CudaDriver*> ctx##_driver = ::baton::CudaDriver::Get(); \
  if (!ctx##_driver.ok()) {                                                              \
    GTEST_SKIP() << "no CUDA driver: " << ctx##_driver.status().message();               \
  }                                                                                      \
  if ((*ctx##_driver)->device_count() == 0) {                                            \
    GTEST_SKIP() << "no CUDA driver: the driver sees no device";                         \
  }                                                                                      \
  ::baton::Result<::baton::PrimaryContext> ctx##_retained =                              \
      ::baton::PrimaryContext::Retain(**ctx##_driver, 0);                                \
  ASSERT_TRUE(ctx##_retained.ok()) << ctx##_retained.status().ToString();                \
  ::baton::PrimaryContext& ctx = *ctx##_retained
#endif

namespace baton::testing {

// A fresh directory under /tmp (short enough for a socket path), removed on destruction.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/baton-cuda-XXXXXX";
    const char* made = ::mkdtemp(tmpl);
    path_ = made != nullptr ? made : "/tmp";
  }
  ~TempDir() {
    std::error_code ec;
    if (path_ != "/tmp") std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace baton::testing
