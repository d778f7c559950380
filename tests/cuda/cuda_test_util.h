// Helpers shared by the CUDA backend's tests: the GPU-or-skip guard, temporary directories and
// where the project's other binaries are.
//
// BATON_CUDA_OR_SKIP(ctx) retains device 0's primary context into `ctx`, or skips the test
// with "no CUDA driver: <why>" where there is no usable GPU (no libcuda, no device), so that
// the same test binary passes on every machine and runs for real on a GPU host.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "base/io/self_exe.h"

#ifdef BATON_HAVE_CUDA_HEADERS
#include "cuda/driver/cuda_driver.h"
#include "cuda/driver/cuda_handles.h"

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

// The folder of the running test binary. The helpers it starts live beside it (bin/) and the
// project's shared libraries in ../lib, in the build folder and in a bundle that
// perf/gpu_bundle made and a GPU host runs from wherever it was copied to.
inline std::string BinDir() {
  const std::string dir = SelfExeDir();
  return dir.empty() ? std::string(BATON_BIN_DIR) : dir;
}
inline std::string LibDir() { return BinDir() + "/../lib"; }

// ptxas: $BATON_PTXAS, else the toolkit's found at configure time, else the toolkit's
// standard location.
inline std::string PtxasPath() {
  if (const char* env = ::getenv("BATON_PTXAS"); env != nullptr && *env != '\0') return env;
#ifdef BATON_PTXAS
  if (::access(BATON_PTXAS, X_OK) == 0) return BATON_PTXAS;
#endif
  return "/usr/local/cuda/bin/ptxas";
}

}  // namespace baton::testing
