// NvmlLibrary: libnvidia-ml.so.1 opened with dlopen, for the one question the promotion
// barrier asks on the CUDA backend: which processes still hold a compute context on this GPU.
//
// After the controller reaps a fenced holder, the driver tears its context down; the barrier
// waits until NVML no longer lists the dead pid on the device before the blocks move on
// (docs/architecture.md, "Memory backends"; docs/gpu.md). The NVML types used are declared
// here (the toolkit's nvml.h is not needed): nvmlInit_v2, nvmlErrorString,
// nvmlDeviceGetHandleByPciBusId_v2 and nvmlDeviceGetComputeRunningProcesses_v3 with its
// four-field process record, an ABI stable since NVML 11.
// Load() uses $BATON_NVML_LIBRARY when set (tests point it at a fake), else
// "libnvidia-ml.so.1"; Unavailable names the library and dlerror. Thread-safe after Load.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "cuda/driver/dl_library.h"

namespace baton {

class NvmlLibrary {
 public:
  static Result<std::unique_ptr<NvmlLibrary>> Load();

  // Pids with a compute context on the GPU at `pci_bus_id` ("0000:3B:00.0", as
  // cuDeviceGetPCIBusId writes it).
  Result<std::vector<pid_t>> ComputePids(const std::string& pci_bus_id) const;
  const std::string& library() const { return library_.name(); }

 private:
  using InitFn = int (*)();
  using ErrorStringFn = const char* (*)(int);
  using HandleByPciFn = int (*)(const char*, void**);
  struct ProcessInfo {
    unsigned int pid;
    unsigned long long used_gpu_memory;
    unsigned int gpu_instance_id;
    unsigned int compute_instance_id;
  };
  using ProcessesFn = int (*)(void*, unsigned int*, ProcessInfo*);

  NvmlLibrary() = default;
  Status Check(int result, const char* call) const;

  DlLibrary library_;
  ErrorStringFn error_string_ = nullptr;
  HandleByPciFn handle_by_pci_ = nullptr;
  ProcessesFn processes_ = nullptr;
};

}  // namespace baton
