#include "cuda/driver/cuda_driver.h"

#ifdef BATON_HAVE_CUDA_HEADERS

#include <cstdlib>
#include <mutex>

namespace baton {
namespace {

// The first version whose cuGetProcAddress reports symbol status (CUDA 12.0).
constexpr const char* kGetProcAddress = "cuGetProcAddress_v2";

Status ResolveOne(PFN_cuGetProcAddress_v12000 get, const std::string& library, const char* name,
                  int version, void** out) {
  CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  const CUresult r = get(name, out, version, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &found);
  if (r != CUDA_SUCCESS) {
    return Unavailable(library + ": cuGetProcAddress(" + name + ", " + std::to_string(version) +
                       ") failed: " + CudaErrorFallbackName(r));
  }
  if (found == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT) {
    return Unavailable(library + ": the driver is too old for " + name + " (needs the CUDA " +
                       std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10) +
                       " API)");
  }
  if (found != CU_GET_PROC_ADDRESS_SUCCESS || *out == nullptr) {
    return Unavailable(library + ": the driver does not provide " + name);
  }
  return OkStatus();
}

}  // namespace

Status CudaDriver::Resolve(void* get_proc_address) {
  auto get = reinterpret_cast<PFN_cuGetProcAddress_v12000>(get_proc_address);
#define BATON_CUDA_RESOLVE(fn, version) \
  BATON_RETURN_IF_ERROR(                \
      ResolveOne(get, library_.name(), #fn, version, reinterpret_cast<void**>(&api_.fn)));
  BATON_CUDA_DRIVER_FUNCTIONS(BATON_CUDA_RESOLVE)
#undef BATON_CUDA_RESOLVE
  return OkStatus();
}

Result<std::unique_ptr<CudaDriver>> CudaDriver::Load(const CudaDriverOptions& options) {
  std::unique_ptr<CudaDriver> driver(new CudaDriver());
  BATON_ASSIGN_OR_RETURN(driver->library_, DlLibrary::Open(options.library));
  void* get = driver->library_.Symbol(kGetProcAddress);
  if (get == nullptr) {
    return Unavailable(options.library + ": no " + std::string(kGetProcAddress) +
                       " (a driver for CUDA 12.0 or later is needed)");
  }
  // cuInit comes first, by its plain symbol, as the driver is only guaranteed to answer
  // cuGetProcAddress once initialized; the error names are bootstrapped the same way so a
  // failing cuInit is reported by name.
  auto init = reinterpret_cast<PFN_cuInit_v2000>(driver->library_.Symbol("cuInit"));
  if (init == nullptr) return Unavailable(options.library + ": no cuInit");
  driver->api_.cuGetErrorName =
      reinterpret_cast<PFN_cuGetErrorName_v6000>(driver->library_.Symbol("cuGetErrorName"));
  driver->api_.cuGetErrorString =
      reinterpret_cast<PFN_cuGetErrorString_v6000>(driver->library_.Symbol("cuGetErrorString"));
  BATON_RETURN_IF_ERROR(driver->Check(init(0), "cuInit"));
  BATON_RETURN_IF_ERROR(driver->Resolve(get));
  BATON_RETURN_IF_ERROR(BATON_CU(*driver, cuDriverGetVersion, &driver->version_));
  if (driver->version_ < 12000) {
    return Unavailable(options.library + ": driver version " + driver->version_string() +
                       " is older than 12.0");
  }
  BATON_RETURN_IF_ERROR(BATON_CU(*driver, cuDeviceGetCount, &driver->device_count_));
  return driver;
}

Result<const CudaDriver*> CudaDriver::Get() {
  static std::once_flag once;
  static const CudaDriver* driver = nullptr;
  static Status* failure = nullptr;
  std::call_once(once, [] {
    CudaDriverOptions options;
    if (const char* lib = std::getenv("BATON_CUDA_LIBRARY"); lib != nullptr && *lib != '\0') {
      options.library = lib;
    }
    Result<std::unique_ptr<CudaDriver>> loaded = Load(options);
    if (loaded.ok()) {
      driver = std::move(loaded).value().release();  // kept for the life of the process
    } else {
      failure = new Status(loaded.status());
    }
  });
  if (driver != nullptr) return driver;
  return *failure;
}

std::string CudaDriver::version_string() const {
  return std::to_string(version_ / 1000) + "." + std::to_string(version_ % 1000 / 10);
}

std::string CudaDriver::ErrorName(CUresult result) const {
  const char* name = nullptr;
  if (api_.cuGetErrorName != nullptr && api_.cuGetErrorName(result, &name) == CUDA_SUCCESS &&
      name != nullptr) {
    return name;
  }
  return CudaErrorFallbackName(static_cast<int>(result));
}

Status CudaDriver::Check(CUresult result, std::string_view call) const {
  if (result == CUDA_SUCCESS) return OkStatus();
  std::string message = std::string(call) + ": " + ErrorName(result);
  const char* text = nullptr;
  if (api_.cuGetErrorString != nullptr && api_.cuGetErrorString(result, &text) == CUDA_SUCCESS &&
      text != nullptr) {
    message += std::string(" (") + text + ")";
  }
  return Status(CudaStatusCode(static_cast<int>(result)), std::move(message));
}

}  // namespace baton

#endif  // BATON_HAVE_CUDA_HEADERS
