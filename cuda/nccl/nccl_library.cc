#include "cuda/nccl/nccl_library.h"

#include <mutex>

namespace baton {
namespace {

template <typename Fn>
Status Find(const DlLibrary& lib, const char* name, Fn* out) {
  *out = reinterpret_cast<Fn>(lib.Symbol(name));
  if (*out == nullptr) return Unavailable(lib.name() + ": no " + name);
  return OkStatus();
}

}  // namespace

Result<std::unique_ptr<NcclLibrary>> NcclLibrary::Load(const std::string& name) {
  std::unique_ptr<NcclLibrary> nccl(new NcclLibrary());
  BATON_ASSIGN_OR_RETURN(nccl->library_, DlLibrary::Open(name));
  GetVersionFn get_version = nullptr;
  BATON_RETURN_IF_ERROR(Find(nccl->library_, "ncclGetVersion", &get_version));
  BATON_RETURN_IF_ERROR(Find(nccl->library_, "ncclCommGetAsyncError", &nccl->get_async_error_));
  BATON_RETURN_IF_ERROR(Find(nccl->library_, "ncclCommAbort", &nccl->abort_));
  BATON_RETURN_IF_ERROR(Find(nccl->library_, "ncclGetErrorString", &nccl->error_string_));
  const int r = get_version(&nccl->version_);
  if (r != kNcclSuccess) {
    return Unavailable(name + ": ncclGetVersion: " + nccl->ErrorString(r));
  }
  return nccl;
}

Result<const NcclLibrary*> NcclLibrary::Get() {
  static std::once_flag once;
  static const NcclLibrary* nccl = nullptr;
  static Status* failure = nullptr;
  std::call_once(once, [] {
    Result<std::unique_ptr<NcclLibrary>> loaded = Load();
    if (loaded.ok()) {
      nccl = std::move(loaded).value().release();  // kept for the life of the process
    } else {
      failure = new Status(loaded.status());
    }
  });
  if (nccl != nullptr) return nccl;
  return *failure;
}

Status NcclLibrary::GetAsyncError(NcclComm comm, int* result) const {
  if (comm == nullptr) return InvalidArgument("ncclCommGetAsyncError: communicator is NULL");
  const int r = get_async_error_(comm, result);
  if (r != kNcclSuccess) return Internal("ncclCommGetAsyncError: " + ErrorString(r));
  return OkStatus();
}

Status NcclLibrary::Abort(NcclComm comm) const {
  if (comm == nullptr) return InvalidArgument("ncclCommAbort: communicator is NULL");
  const int r = abort_(comm);
  if (r != kNcclSuccess) return Internal("ncclCommAbort: " + ErrorString(r));
  return OkStatus();
}

std::string NcclLibrary::ErrorString(int result) const {
  const char* text = error_string_ != nullptr ? error_string_(result) : nullptr;
  std::string out = "ncclResult " + std::to_string(result);
  if (text != nullptr) out += " (" + std::string(text) + ")";
  return out;
}

std::string NcclLibrary::version_string() const {
  // NCCL_VERSION_CODE is major*10000 + minor*100 + patch since 2.9, major*1000 + ... before.
  const int major = version_ >= 10000 ? version_ / 10000 : version_ / 1000;
  const int minor = version_ >= 10000 ? version_ / 100 % 100 : version_ / 100 % 10;
  const int patch = version_ % 100;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

}  // namespace baton
