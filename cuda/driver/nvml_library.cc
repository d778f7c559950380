#include "cuda/driver/nvml_library.h"

#include <cstdlib>

namespace baton {
namespace {

constexpr int kNvmlSuccess = 0;
constexpr int kNvmlInsufficientSize = 7;

}  // namespace

Result<std::unique_ptr<NvmlLibrary>> NvmlLibrary::Load() {
  const char* env = std::getenv("BATON_NVML_LIBRARY");
  const std::string name = env != nullptr && *env != '\0' ? env : "libnvidia-ml.so.1";
  std::unique_ptr<NvmlLibrary> n(new NvmlLibrary());
  BATON_ASSIGN_OR_RETURN(n->library_, DlLibrary::Open(name));
  auto init = reinterpret_cast<InitFn>(n->library_.Symbol("nvmlInit_v2"));
  n->error_string_ = reinterpret_cast<ErrorStringFn>(n->library_.Symbol("nvmlErrorString"));
  n->handle_by_pci_ =
      reinterpret_cast<HandleByPciFn>(n->library_.Symbol("nvmlDeviceGetHandleByPciBusId_v2"));
  n->processes_ =
      reinterpret_cast<ProcessesFn>(n->library_.Symbol("nvmlDeviceGetComputeRunningProcesses_v3"));
  if (init == nullptr || n->handle_by_pci_ == nullptr || n->processes_ == nullptr) {
    return Unavailable(name +
                       ": lacks nvmlInit_v2, nvmlDeviceGetHandleByPciBusId_v2 or "
                       "nvmlDeviceGetComputeRunningProcesses_v3 (driver older than R510)");
  }
  BATON_RETURN_IF_ERROR(n->Check(init(), "nvmlInit_v2"));
  return n;
}

Status NvmlLibrary::Check(int result, const char* call) const {
  if (result == kNvmlSuccess) return OkStatus();
  const char* text = error_string_ != nullptr ? error_string_(result) : nullptr;
  return Unavailable(std::string(call) + ": NVML error " + std::to_string(result) +
                     (text != nullptr ? std::string(" (") + text + ")" : ""));
}

Result<std::vector<pid_t>> NvmlLibrary::ComputePids(const std::string& pci_bus_id) const {
  void* device = nullptr;
  BATON_RETURN_IF_ERROR(
      Check(handle_by_pci_(pci_bus_id.c_str(), &device), "nvmlDeviceGetHandleByPciBusId_v2"));
  std::vector<ProcessInfo> infos(16);
  while (true) {
    auto count = static_cast<unsigned int>(infos.size());
    const int r = processes_(device, &count, infos.data());
    if (r == kNvmlInsufficientSize && count > infos.size() && count < 1'000'000) {
      infos.resize(count + 8);  // more processes came and went: ask again with room to spare
      continue;
    }
    BATON_RETURN_IF_ERROR(Check(r, "nvmlDeviceGetComputeRunningProcesses_v3"));
    std::vector<pid_t> pids;
    for (unsigned int i = 0; i < count && i < infos.size(); ++i) {
      pids.push_back(static_cast<pid_t>(infos[i].pid));
    }
    return pids;
  }
}

}  // namespace baton
