// CudaDriver: libcuda opened with dlopen and its entry points resolved through
// cuGetProcAddress, so that one build runs with and without a GPU.
//
// Load() dlopens the driver library ("libcuda.so.1" by default), requires
// cuGetProcAddress_v2 (the CUDA 12+ form that reports whether a symbol was found), calls
// cuInit(0) by its plain symbol (the driver answers cuGetProcAddress once initialized), then
// resolves every function in BATON_CUDA_DRIVER_FUNCTIONS at the ABI version named by its
// cudaTypedefs.h typedef. Each failure is a Status naming the call and, for a driver error,
// the CUresult's name and text ("cuInit: CUDA_ERROR_NO_DEVICE (no CUDA-capable device is
// detected)"); a missing library is Unavailable("libcuda.so.1: <dlerror>"). Get() is the
// process-wide driver, loaded once; its outcome is kept.
//
// Only the driver API is used (no libcudart), with the toolkit's cuda.h for types. This
// header needs the toolkit (BATON_HAVE_CUDA_HEADERS); cuda/driver/gpu_backend.h is the
// header-independent face used by the controller and the SDK.
// Thread-safety: a loaded CudaDriver is immutable; its functions are the driver's, which are
// thread-safe. Get() is thread-safe.
#pragma once

#ifdef BATON_HAVE_CUDA_HEADERS

#include <cuda.h>
#include <cudaTypedefs.h>

#include <memory>
#include <string>
#include <string_view>

#include "base/status.h"
#include "cuda/driver/cuda_errors.h"
#include "cuda/driver/dl_library.h"

namespace baton {

// X(function, version): the member `function` has type PFN_<function>_v<version> and is
// resolved with cuGetProcAddress("function", ..., version, ...). (cuda.h renames some members,
// e.g. cuMemcpyHtoD to cuMemcpyHtoD_v2; the macros see the same name everywhere.)
#define BATON_CUDA_DRIVER_FUNCTIONS(X)     \
  X(cuGetErrorName, 6000)                  \
  X(cuGetErrorString, 6000)                \
  X(cuInit, 2000)                          \
  X(cuDriverGetVersion, 2020)              \
  X(cuDeviceGet, 2000)                     \
  X(cuDeviceGetCount, 2000)                \
  X(cuDeviceGetName, 2000)                 \
  X(cuDeviceGetAttribute, 2000)            \
  X(cuDeviceTotalMem, 3020)                \
  X(cuDeviceGetPCIBusId, 4010)             \
  X(cuDevicePrimaryCtxRetain, 7000)        \
  X(cuDevicePrimaryCtxRelease, 11000)      \
  X(cuCtxSetCurrent, 4000)                 \
  X(cuMemGetInfo, 3020)                    \
  X(cuMemGetAllocationGranularity, 10020)  \
  X(cuMemCreate, 10020)                    \
  X(cuMemRelease, 10020)                   \
  X(cuMemExportToShareableHandle, 10020)   \
  X(cuMemImportFromShareableHandle, 10020) \
  X(cuMemAddressReserve, 10020)            \
  X(cuMemAddressFree, 10020)               \
  X(cuMemMap, 10020)                       \
  X(cuMemUnmap, 10020)                     \
  X(cuMemSetAccess, 10020)                 \
  X(cuStreamCreate, 2000)                  \
  X(cuStreamDestroy, 4000)                 \
  X(cuStreamQuery, 2000)                   \
  X(cuStreamSynchronize, 2000)             \
  X(cuEventCreate, 2000)                   \
  X(cuEventDestroy, 4000)                  \
  X(cuEventRecord, 2000)                   \
  X(cuEventQuery, 2000)                    \
  X(cuEventElapsedTime, 2000)              \
  X(cuMemcpyHtoD, 3020)                    \
  X(cuMemcpyHtoDAsync, 3020)               \
  X(cuMemcpyDtoH, 3020)                    \
  X(cuMemcpyDtoHAsync, 3020)               \
  X(cuMemcpyDtoDAsync, 3020)               \
  X(cuMemsetD32Async, 3020)                \
  X(cuMemHostRegister, 6050)               \
  X(cuMemHostUnregister, 4000)             \
  X(cuMemAllocHost, 3020)                  \
  X(cuMemFreeHost, 2000)                   \
  X(cuModuleLoadDataEx, 2010)              \
  X(cuModuleUnload, 2000)                  \
  X(cuModuleGetFunction, 2000)             \
  X(cuLaunchKernel, 4000)

struct CudaDriverApi {
#define BATON_CUDA_PFN_MEMBER(fn, version) PFN_##fn##_v##version fn = nullptr;
  BATON_CUDA_DRIVER_FUNCTIONS(BATON_CUDA_PFN_MEMBER)
#undef BATON_CUDA_PFN_MEMBER
};

struct CudaDriverOptions {
  std::string library = "libcuda.so.1";  // a soname or a path
};

class CudaDriver {
 public:
  static Result<std::unique_ptr<CudaDriver>> Load(const CudaDriverOptions& options = {});
  // The process-wide driver from "libcuda.so.1" (or $BATON_CUDA_LIBRARY when set), loaded
  // on the first call. Never unloaded.
  static Result<const CudaDriver*> Get();

  const CudaDriverApi& api() const { return api_; }
  const CudaDriverApi* operator->() const { return &api_; }
  const std::string& library() const { return library_.name(); }
  // cuDriverGetVersion: 1000 x major + 10 x minor, e.g. 12040 for 12.4.
  int version() const { return version_; }
  std::string version_string() const;
  int device_count() const { return device_count_; }

  // OK for CUDA_SUCCESS, else "<call>: <CUDA_ERROR_NAME> (<text>)" with a StatusCode that
  // fits the error (ResourceExhausted for out of memory, Unavailable for no device, ...).
  Status Check(CUresult result, std::string_view call) const;
  // "CUDA_ERROR_ILLEGAL_ADDRESS", or "CUresult 12345" when the driver does not know it.
  std::string ErrorName(CUresult result) const;

 private:
  CudaDriver() = default;
  Status Resolve(void* get_proc_address);

  DlLibrary library_;
  CudaDriverApi api_;
  int version_ = 0;
  int device_count_ = 0;
};

}  // namespace baton

// Calls api().fn(args...) on `driver` and converts the CUresult into a Status naming `fn`.
#define BATON_CU(driver, fn, ...) (driver).Check((driver).api().fn(__VA_ARGS__), #fn)

#endif  // BATON_HAVE_CUDA_HEADERS
