#include "cuda/driver/gpu_backend.h"

#include "cuda/driver/cuda_errors.h"

#ifdef BATON_HAVE_CUDA_HEADERS
#include "cuda/driver/cuda_driver.h"
#endif

namespace baton {

const char* ToString(BackendMode mode) {
  switch (mode) {
    case BackendMode::kAuto:
      return "auto";
    case BackendMode::kHost:
      return "host";
    case BackendMode::kCuda:
      return "cuda";
  }
  return "unknown";
}

const char* ToString(MemoryBackendKind kind) {
  return kind == MemoryBackendKind::kCuda ? "cuda" : "host";
}

Result<BackendMode> ParseBackendMode(std::string_view text) {
  if (text == "auto") return BackendMode::kAuto;
  if (text == "host") return BackendMode::kHost;
  if (text == "cuda") return BackendMode::kCuda;
  return InvalidArgument("backend must be auto, host or cuda, got '" + std::string(text) + "'");
}

std::string BackendChoice::LogLine() const {
  if (kind == MemoryBackendKind::kHost) return "backend: host (" + reason + ")";
  std::string line = "backend: cuda (device " + std::to_string(device);
  if (!device_name.empty()) line += " " + device_name;
  return line + ", driver " + driver_version + ")";
}

bool CudaBackendCompiled() {
#ifdef BATON_HAVE_CUDA_HEADERS
  return true;
#else
  return false;
#endif
}

namespace {

#ifdef BATON_HAVE_CUDA_HEADERS
// Whether device `ordinal` can serve the CUDA backend; fills name and version on success.
Status ProbeDevice(const CudaDriver& cu, int ordinal, BackendChoice* choice) {
  choice->driver_version = cu.version_string();
  if (cu.device_count() == 0) return Unavailable("no CUDA device visible");
  if (ordinal < 0 || ordinal >= cu.device_count()) {
    return InvalidArgument("CUDA device " + std::to_string(ordinal) + " does not exist (" +
                           std::to_string(cu.device_count()) + " visible)");
  }
  CUdevice dev = 0;
  BATON_RETURN_IF_ERROR(BATON_CU(cu, cuDeviceGet, &dev, ordinal));
  char name[256] = {};
  BATON_RETURN_IF_ERROR(BATON_CU(cu, cuDeviceGetName, name, sizeof(name) - 1, dev));
  int vmm = 0;
  int posix_fd = 0;
  int mode = 0;
  BATON_RETURN_IF_ERROR(BATON_CU(cu, cuDeviceGetAttribute, &vmm,
                                 CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev));
  BATON_RETURN_IF_ERROR(BATON_CU(cu, cuDeviceGetAttribute, &posix_fd,
                                 CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                                 dev));
  BATON_RETURN_IF_ERROR(
      BATON_CU(cu, cuDeviceGetAttribute, &mode, CU_DEVICE_ATTRIBUTE_COMPUTE_MODE, dev));
  const std::string who = "device " + std::to_string(ordinal) + " (" + name + ")";
  if (vmm == 0) return FailedPrecondition(who + " does not support virtual memory management");
  if (posix_fd == 0) return FailedPrecondition(who + " cannot export memory as POSIX fds");
  if (mode == CU_COMPUTEMODE_EXCLUSIVE_PROCESS || mode == CU_COMPUTEMODE_PROHIBITED) {
    return FailedPrecondition(who + " is in compute mode " + std::to_string(mode) +
                              "; the standby needs the default mode (nvidia-smi -c DEFAULT)");
  }
  choice->device = ordinal;
  choice->device_name = name;
  return OkStatus();
}
#endif

Status ProbeCuda(const BackendOptions& options, BackendChoice* choice) {
#ifdef BATON_HAVE_CUDA_HEADERS
  Result<const CudaDriver*> cu = CudaDriver::Get();
  if (!cu.ok()) return cu.status();
  return ProbeDevice(**cu, options.device, choice);
#else
  (void)options;
  (void)choice;
  return Unimplemented("CUDA backend not compiled (built without the CUDA toolkit headers)");
#endif
}

}  // namespace

Result<BackendChoice> ChooseMemoryBackend(const BackendOptions& options) {
  BackendChoice choice;
  if (options.mode == BackendMode::kHost) {
    choice.reason = "configured";
    return choice;
  }
  Status probed = ProbeCuda(options, &choice);
  if (probed.ok()) {
    choice.kind = MemoryBackendKind::kCuda;
    return choice;
  }
  if (options.mode == BackendMode::kCuda) {
    return probed.WithContext("backend cuda was configured but cannot be used");
  }
  choice = BackendChoice{};
  choice.reason = probed.message();
  return choice;
}

std::string DescribeCudaError(int result) {
  if (result == 0) return CudaErrorFallbackName(0);
#ifdef BATON_HAVE_CUDA_HEADERS
  Result<const CudaDriver*> cu = CudaDriver::Get();
  if (cu.ok()) {
    const std::string text = (*cu)->Check(static_cast<CUresult>(result), "").message();
    return text.substr(2);  // drop the ": " of the empty call name
  }
#endif
  return CudaErrorFallbackName(result);
}

}  // namespace baton
