// DeviceAccess: the test engine's reads and writes of device memory, through the driver
// (cuMemcpyDtoH / cuMemcpyHtoD), so the same engine runs on a GPU and on the fake driver's
// emulated device. Open() retains the device's primary context; each thread that reads or
// writes makes it current first (Read/Write do). Header-only test support.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "base/status.h"

#ifdef BATON_HAVE_CUDA_HEADERS
#include "cuda/driver/cuda_driver.h"
#include "cuda/driver/cuda_handles.h"
#endif

namespace baton::testing {

class DeviceAccess {
 public:
#ifdef BATON_HAVE_CUDA_HEADERS
  static Result<DeviceAccess> Open(int device) {
    BATON_ASSIGN_OR_RETURN(const CudaDriver* driver, CudaDriver::Get());
    DeviceAccess d;
    BATON_ASSIGN_OR_RETURN(d.ctx_, PrimaryContext::Retain(*driver, device));
    return d;
  }
  Status Read(uint64_t address, void* dst, size_t bytes) const {
    BATON_RETURN_IF_ERROR(ctx_.MakeCurrent());
    return BATON_CU(ctx_.driver(), cuMemcpyDtoH, dst, address, bytes);
  }
  Status Write(uint64_t address, const void* src, size_t bytes) const {
    BATON_RETURN_IF_ERROR(ctx_.MakeCurrent());
    return BATON_CU(ctx_.driver(), cuMemcpyHtoD, address, src, bytes);
  }

 private:
  PrimaryContext ctx_;
#else
  static Result<DeviceAccess> Open(int) { return Unimplemented("built without CUDA headers"); }
  Status Read(uint64_t, void*, size_t) const { return Unimplemented("no CUDA"); }
  Status Write(uint64_t, const void*, size_t) const { return Unimplemented("no CUDA"); }
#endif
};

}  // namespace baton::testing
