// CUDA error classification that needs no CUDA headers: which CUresult values are sticky
// (the context is unusable and the process must be replaced), the StatusCode each maps to,
// and names for the common ones when no driver is loaded to ask.
//
// Used by the engine SDK to report sticky errors (EngineSession::ReportCudaError) and by
// CudaDriver::Check. Values are the CUresult numbers of cuda.h, which are stable across CUDA
// releases. The runtime's cudaError_t (what PyTorch reports) has the same number as the
// CUresult of the same meaning for every sticky error and for out of memory (CUDA 13.0's
// driver_types.h and cuda.h); the runtime-only codes are never sticky. Pure functions;
// thread-safe.
#pragma once

#include <string>

#include "base/status.h"

namespace baton {

// True for errors after which the CUDA context cannot be used again (illegal address,
// launch failure, uncorrectable ECC, ...): the engine must stop and be replaced.
bool IsStickyCudaError(int result);

// The StatusCode that fits a CUresult (0 is kOk).
StatusCode CudaStatusCode(int result);

// "CUDA_ERROR_ILLEGAL_ADDRESS" for the errors Baton handles by name; "CUresult N" else.
std::string CudaErrorFallbackName(int result);

}  // namespace baton
