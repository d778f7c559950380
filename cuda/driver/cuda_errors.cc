#include "cuda/driver/cuda_errors.h"

namespace baton {
namespace {

struct KnownError {
  int value;
  const char* name;
};

// The subset of cuda.h's CUresult values that Baton names or classifies.
constexpr KnownError kKnown[] = {
    {0, "CUDA_SUCCESS"},
    {1, "CUDA_ERROR_INVALID_VALUE"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY"},
    {3, "CUDA_ERROR_NOT_INITIALIZED"},
    {4, "CUDA_ERROR_DEINITIALIZED"},
    {34, "CUDA_ERROR_STUB_LIBRARY"},
    {35, "cudaErrorInsufficientDriver"},  // a runtime code (cudaError_t), from PyTorch
    {46, "CUDA_ERROR_DEVICE_UNAVAILABLE"},
    {100, "CUDA_ERROR_NO_DEVICE"},
    {101, "CUDA_ERROR_INVALID_DEVICE"},
    {201, "CUDA_ERROR_INVALID_CONTEXT"},
    {214, "CUDA_ERROR_ECC_UNCORRECTABLE"},
    {218, "CUDA_ERROR_INVALID_PTX"},
    {220, "CUDA_ERROR_NVLINK_UNCORRECTABLE"},
    {222, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"},
    {226, "CUDA_ERROR_CONTAINED"},
    {600, "CUDA_ERROR_NOT_READY"},
    {700, "CUDA_ERROR_ILLEGAL_ADDRESS"},
    {701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"},
    {702, "CUDA_ERROR_LAUNCH_TIMEOUT"},
    {709, "CUDA_ERROR_CONTEXT_IS_DESTROYED"},
    {710, "CUDA_ERROR_ASSERT"},
    {714, "CUDA_ERROR_HARDWARE_STACK_ERROR"},
    {715, "CUDA_ERROR_ILLEGAL_INSTRUCTION"},
    {716, "CUDA_ERROR_MISALIGNED_ADDRESS"},
    {717, "CUDA_ERROR_INVALID_ADDRESS_SPACE"},
    {718, "CUDA_ERROR_INVALID_PC"},
    {719, "CUDA_ERROR_LAUNCH_FAILED"},
    {721, "CUDA_ERROR_TENSOR_MEMORY_LEAK"},
    {800, "CUDA_ERROR_NOT_PERMITTED"},
    {801, "CUDA_ERROR_NOT_SUPPORTED"},
    {802, "CUDA_ERROR_SYSTEM_NOT_READY"},
    {803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"},
    {804, "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE"},
    {911, "CUDA_ERROR_EXTERNAL_DEVICE"},
    {999, "CUDA_ERROR_UNKNOWN"},
};

}  // namespace

bool IsStickyCudaError(int result) {
  switch (result) {
    case 214:  // ECC_UNCORRECTABLE
    case 220:  // NVLINK_UNCORRECTABLE
    case 226:  // CONTAINED
    case 700:  // ILLEGAL_ADDRESS
    case 702:  // LAUNCH_TIMEOUT
    case 709:  // CONTEXT_IS_DESTROYED
    case 710:  // ASSERT
    case 714:  // HARDWARE_STACK_ERROR
    case 715:  // ILLEGAL_INSTRUCTION
    case 716:  // MISALIGNED_ADDRESS
    case 717:  // INVALID_ADDRESS_SPACE
    case 718:  // INVALID_PC
    case 719:  // LAUNCH_FAILED
    case 721:  // TENSOR_MEMORY_LEAK
    case 911:  // EXTERNAL_DEVICE
    case 999:  // UNKNOWN
      return true;
    default:
      return false;
  }
}

StatusCode CudaStatusCode(int result) {
  if (result == 0) return StatusCode::kOk;
  if (IsStickyCudaError(result)) return StatusCode::kInternal;
  switch (result) {
    case 1:    // INVALID_VALUE
    case 101:  // INVALID_DEVICE
    case 218:  // INVALID_PTX
      return StatusCode::kInvalidArgument;
    case 2:  // OUT_OF_MEMORY
      return StatusCode::kResourceExhausted;
    case 3:    // NOT_INITIALIZED
    case 4:    // DEINITIALIZED
    case 34:   // STUB_LIBRARY
    case 35:   // cudaErrorInsufficientDriver (runtime)
    case 46:   // DEVICE_UNAVAILABLE
    case 100:  // NO_DEVICE
    case 600:  // NOT_READY
    case 802:  // SYSTEM_NOT_READY
    case 803:  // SYSTEM_DRIVER_MISMATCH
    case 804:  // COMPAT_NOT_SUPPORTED_ON_DEVICE
      return StatusCode::kUnavailable;
    case 222:  // UNSUPPORTED_PTX_VERSION
    case 800:  // NOT_PERMITTED
    case 801:  // NOT_SUPPORTED
      return StatusCode::kFailedPrecondition;
    default:
      return StatusCode::kInternal;
  }
}

std::string CudaErrorFallbackName(int result) {
  for (const KnownError& e : kKnown) {
    if (e.value == result) return e.name;
  }
  return "CUresult " + std::to_string(result);
}

}  // namespace baton
