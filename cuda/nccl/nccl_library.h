// NcclLibrary: libnccl opened with dlopen, for the few calls Baton makes on communicators an
// engine created: ncclCommGetAsyncError (the watcher's poll), ncclCommAbort (on fence or
// after an error), ncclGetErrorString and ncclGetVersion. The prototypes are declared here
// (NCCL's headers need not be installed); the types are NCCL's stable C ABI: ncclResult_t is
// an int enum (0 success, 7 in progress), a communicator an opaque pointer.
//
// Load() fails with Unavailable("libnccl.so.2: <dlerror>") where NCCL is not installed; the
// engine then has no communicators to watch. Get() is the process-wide library, loaded once.
// Immutable after Load; thread-safe (NCCL allows these calls from any thread).
#pragma once

#include <memory>
#include <string>

#include "base/status.h"
#include "cuda/driver/dl_library.h"

namespace baton {

using NcclComm = void*;  // ncclComm_t

inline constexpr int kNcclSuccess = 0;
inline constexpr int kNcclInProgress = 7;

class NcclLibrary {
 public:
  static Result<std::unique_ptr<NcclLibrary>> Load(const std::string& name = "libnccl.so.2");
  static Result<const NcclLibrary*> Get();

  // ncclCommGetAsyncError: OK with *result set, or the call's own failure.
  Status GetAsyncError(NcclComm comm, int* result) const;
  // ncclCommAbort: frees the communicator and aborts its uncompleted operations.
  Status Abort(NcclComm comm) const;
  // "unhandled cuda error (run with NCCL_DEBUG=INFO for details)" etc.
  std::string ErrorString(int result) const;
  // NCCL_VERSION_CODE, e.g. 22805 for 2.28.5.
  int version() const { return version_; }
  std::string version_string() const;

 private:
  NcclLibrary() = default;
  using GetAsyncErrorFn = int (*)(NcclComm, int*);
  using AbortFn = int (*)(NcclComm);
  using ErrorStringFn = const char* (*)(int);
  using GetVersionFn = int (*)(int*);

  DlLibrary library_;
  GetAsyncErrorFn get_async_error_ = nullptr;
  AbortFn abort_ = nullptr;
  ErrorStringFn error_string_ = nullptr;
  int version_ = 0;
};

}  // namespace baton
