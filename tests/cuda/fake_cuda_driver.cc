// A stand-in for libcuda.so.1 that lets the loader's paths be tested without a GPU. It
// exports cuInit, cuGetErrorName, cuGetErrorString and cuGetProcAddress_v2, and answers as
// $BATON_FAKE_CUDA says (read at each call):
//   "no_device"       cuInit fails with CUDA_ERROR_NO_DEVICE
//   "missing:NAME"    cuGetProcAddress reports NAME as not found
//   "old:NAME"        cuGetProcAddress reports NAME as needing a newer driver
//   "old_driver"      cuDriverGetVersion says 11080
//   "vmm"             a working driver 12.4 with one device whose memory is host memory
//                     (tests/cuda/fake_cuda_vmm.cc)
//   anything else     a working driver 12.4 with no devices
// Functions it does not implement resolve to one that returns CUDA_ERROR_NOT_SUPPORTED.
#ifdef BATON_HAVE_CUDA_HEADERS

#include <cuda.h>

#include <cstdlib>
#include <cstring>
#include <string>

void* FakeVmmFunction(const char* symbol);

namespace {

std::string Mode() {
  const char* m = std::getenv("BATON_FAKE_CUDA");
  return m == nullptr ? "" : m;
}

CUresult NotSupported() { return CUDA_ERROR_NOT_SUPPORTED; }

// The errors this driver names (cuGetErrorName / cuGetErrorString); others are unknown to it.
struct FakeError {
  CUresult code;
  const char* name;
  const char* text;
};
constexpr FakeError kErrors[] = {
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS",
     "an illegal memory access was encountered"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_CONTEXT_IS_DESTROYED, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"},
    {CUDA_ERROR_ECC_UNCORRECTABLE, "CUDA_ERROR_ECC_UNCORRECTABLE",
     "uncorrectable ECC error encountered"},
    {CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
     "part or all of the requested memory range is already mapped"},
    {CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
     "pointer does not correspond to a registered memory region"},
};
const FakeError* FindError(CUresult code) {
  for (const FakeError& e : kErrors) {
    if (e.code == code) return &e;
  }
  return nullptr;
}

CUresult FakeDriverGetVersion(int* version) {
  *version = Mode() == "old_driver" ? 11080 : 12040;
  return CUDA_SUCCESS;
}

CUresult FakeDeviceGetCount(int* count) {
  *count = 0;
  return CUDA_SUCCESS;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) CUresult cuInit(unsigned int) {
  return Mode() == "no_device" ? CUDA_ERROR_NO_DEVICE : CUDA_SUCCESS;
}

__attribute__((visibility("default"))) CUresult cuGetErrorName(CUresult error, const char** out) {
  const FakeError* e = FindError(error);
  *out = e != nullptr ? e->name : nullptr;
  return e != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

__attribute__((visibility("default"))) CUresult cuGetErrorString(CUresult error, const char** out) {
  const FakeError* e = FindError(error);
  *out = e != nullptr ? e->text : nullptr;
  return e != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

__attribute__((visibility("default"))) CUresult cuGetProcAddress_v2(
    const char* symbol, void** pfn, int, cuuint64_t, CUdriverProcAddressQueryResult* status) {
  const std::string mode = Mode();
  *pfn = nullptr;
  if (mode == "missing:" + std::string(symbol)) {
    *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return CUDA_SUCCESS;
  }
  if (mode == "old:" + std::string(symbol)) {
    *status = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
    return CUDA_SUCCESS;
  }
  *status = CU_GET_PROC_ADDRESS_SUCCESS;
  if (mode == "vmm" && FakeVmmFunction(symbol) != nullptr) {
    *pfn = FakeVmmFunction(symbol);
  } else if (std::strcmp(symbol, "cuInit") == 0) {
    *pfn = reinterpret_cast<void*>(&cuInit);
  } else if (std::strcmp(symbol, "cuGetErrorName") == 0) {
    *pfn = reinterpret_cast<void*>(&cuGetErrorName);
  } else if (std::strcmp(symbol, "cuGetErrorString") == 0) {
    *pfn = reinterpret_cast<void*>(&cuGetErrorString);
  } else if (std::strcmp(symbol, "cuDriverGetVersion") == 0) {
    *pfn = reinterpret_cast<void*>(&FakeDriverGetVersion);
  } else if (std::strcmp(symbol, "cuDeviceGetCount") == 0) {
    *pfn = reinterpret_cast<void*>(&FakeDeviceGetCount);
  } else {
    *pfn = reinterpret_cast<void*>(&NotSupported);
  }
  return CUDA_SUCCESS;
}

}  // extern "C"

#endif  // BATON_HAVE_CUDA_HEADERS
