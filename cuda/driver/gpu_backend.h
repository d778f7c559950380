// The memory backend choice, made once at start-up by the controller (and usable by any
// process), and the CUDA facts that need no CUDA headers.
//
// ChooseMemoryBackend() loads libcuda (CudaDriver::Get) and checks that the configured device
// exists, supports virtual memory management with POSIX-fd export, and is in the default
// compute mode (exclusive-process would keep the standby from holding a context next to the
// primary). mode "auto" falls back to the host backend with the reason; mode "cuda" makes a
// failed check an error; mode "host" does not touch the driver. BackendChoice::LogLine() is
// the start-up log line: "backend: host (libcuda.so.1: cannot open shared object file: No
// such file or directory)" or "backend: cuda (device 0 NVIDIA H200, driver 13.0)".
// Builds without the CUDA toolkit compile this file too: there, "auto" is host ("CUDA backend
// not compiled") and "cuda" is an error. Thread-safe.
#pragma once

#include <string>
#include <string_view>

#include "base/status.h"

namespace baton {

enum class BackendMode { kAuto, kHost, kCuda };
enum class MemoryBackendKind { kHost, kCuda };

const char* ToString(BackendMode mode);
const char* ToString(MemoryBackendKind kind);
// "auto", "host" or "cuda".
Result<BackendMode> ParseBackendMode(std::string_view text);

struct BackendOptions {
  BackendMode mode = BackendMode::kAuto;
  int device = 0;  // CUDA device ordinal (after CUDA_VISIBLE_DEVICES)
};

struct BackendChoice {
  MemoryBackendKind kind = MemoryBackendKind::kHost;
  int device = -1;
  std::string device_name;
  std::string driver_version;  // "13.0"
  std::string reason;          // host: why; cuda: empty
  std::string LogLine() const;
};

Result<BackendChoice> ChooseMemoryBackend(const BackendOptions& options);

// True when this build has the CUDA backend's device code (BATON_HAVE_CUDA_HEADERS).
bool CudaBackendCompiled();

// "CUDA_ERROR_ILLEGAL_ADDRESS (an illegal memory access was encountered)", asking the driver
// when it is loaded and the built-in table otherwise.
std::string DescribeCudaError(int result);

}  // namespace baton
