// The fake driver's "vmm" mode, contexts: the device's primary context, retained and released
// (cuDevicePrimaryCtxRetain / cuDevicePrimaryCtxRelease), and the context current on each
// thread (cuCtxSetCurrent). As on the real driver, the calls that work in a context
// (fake_cuda_state.h: InContext) fail with CUDA_ERROR_INVALID_CONTEXT on a thread where no
// context is current, and with CUDA_ERROR_CONTEXT_IS_DESTROYED once the last retain of the
// primary context is released; that release also ends what the context held: its page-locked
// host ranges.
#ifdef BATON_HAVE_CUDA_HEADERS

#include <cuda.h>

#include <mutex>

#include "tests/cuda/fake_cuda_state.h"

namespace baton::fake_cuda {
namespace {

int the_primary_context;
CUcontext Primary() { return reinterpret_cast<CUcontext>(&the_primary_context); }

std::mutex mu;
int retains = 0;  // guarded by mu
thread_local CUcontext current = nullptr;

CUresult PrimaryCtxRetain(CUcontext* ctx, CUdevice device) {
  if (DeviceLost()) return CUDA_ERROR_ECC_UNCORRECTABLE;
  if (device != 0) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard<std::mutex> lock(mu);
  ++retains;
  *ctx = Primary();
  return CUDA_SUCCESS;
}

CUresult PrimaryCtxRelease(CUdevice device) {
  if (device != 0) return CUDA_ERROR_INVALID_DEVICE;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (retains == 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (--retains > 0) return CUDA_SUCCESS;
  }
  State::Get().ForgetPinned();
  return CUDA_SUCCESS;
}

CUresult CtxSetCurrent(CUcontext ctx) {
  if (ctx != nullptr && ctx != Primary()) return CUDA_ERROR_INVALID_CONTEXT;
  current = ctx;
  return CUDA_SUCCESS;
}

const Entry kContextEntries[] = {
    BATON_FAKE("cuDevicePrimaryCtxRetain", PrimaryCtxRetain),
    BATON_FAKE("cuDevicePrimaryCtxRelease", PrimaryCtxRelease),
    BATON_FAKE("cuCtxSetCurrent", CtxSetCurrent),
};

}  // namespace

CUresult NeedContext() {
  if (current == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  std::lock_guard<std::mutex> lock(mu);
  return retains > 0 ? CUDA_SUCCESS : CUDA_ERROR_CONTEXT_IS_DESTROYED;
}

void* ContextFunction(const char* symbol) { return FindEntry(kContextEntries, symbol); }

}  // namespace baton::fake_cuda

#endif  // BATON_HAVE_CUDA_HEADERS
