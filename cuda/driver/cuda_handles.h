// Move-only owners of CUDA driver handles, one type per kind: the primary context of a device
// (retained and released), a stream, an event, a module, a host registration, pinned host
// memory from cuMemAllocHost, a VMM allocation handle (cuMemCreate or imported, released with
// cuMemRelease), a reserved address range (cuMemAddressFree) and a mapping (cuMemUnmap).
//
// Each holds the CudaDriver it came from, which must outlive it (CudaDriver::Get() lives for
// the process). Move assignment swaps: the moved-from owner releases what the target held.
// Destructors release and log a warning if the driver refuses; they never throw. Members of
// composite owners are declared so that mappings go before the handles and ranges they use, and
// those before the context. Thread-compatible: one owner per thread, as the driver's handles
// themselves are thread-safe but these wrappers are not.
#pragma once

#ifdef BATON_HAVE_CUDA_HEADERS

#include <cuda.h>

#include <cstddef>
#include <optional>
#include <string>
#include <utility>

#include "base/clock.h"
#include "base/io/unique_fd.h"
#include "base/status.h"
#include "cuda/driver/cuda_driver.h"

namespace baton {

// Shared move/reset plumbing: `T` is the raw handle, `kNone` its empty value.
template <typename T, T kNone>
class CuOwner {
 public:
  CuOwner() = default;
  CuOwner(const CudaDriver* driver, T handle) : driver_(driver), handle_(handle) {}
  CuOwner(CuOwner&& o) noexcept
      : driver_(std::exchange(o.driver_, nullptr)), handle_(std::exchange(o.handle_, kNone)) {}
  CuOwner& operator=(CuOwner&& o) noexcept {
    if (this != &o) {
      std::swap(driver_, o.driver_);
      std::swap(handle_, o.handle_);
    }
    return *this;
  }
  CuOwner(const CuOwner&) = delete;
  CuOwner& operator=(const CuOwner&) = delete;

  T get() const { return handle_; }
  bool valid() const { return handle_ != kNone; }
  const CudaDriver* driver() const { return driver_; }

 protected:
  T release() { return std::exchange(handle_, kNone); }
  const CudaDriver* driver_ = nullptr;
  T handle_ = kNone;
};

// Logs a failed release in a destructor.
void WarnRelease(const CudaDriver& driver, CUresult result, const char* call);

class PrimaryContext {
 public:
  PrimaryContext() = default;
  ~PrimaryContext();
  PrimaryContext(PrimaryContext&& o) noexcept;
  PrimaryContext& operator=(PrimaryContext&& o) noexcept;
  PrimaryContext(const PrimaryContext&) = delete;
  PrimaryContext& operator=(const PrimaryContext&) = delete;

  // Retains device `ordinal`'s primary context and makes it current on this thread.
  static Result<PrimaryContext> Retain(const CudaDriver& driver, int ordinal);
  // Makes the context current on the calling thread (each thread that calls the driver).
  Status MakeCurrent() const;

  CUcontext get() const { return context_; }
  CUdevice device() const { return device_; }
  int ordinal() const { return ordinal_; }
  const CudaDriver& driver() const { return *driver_; }

 private:
  void Reset();
  const CudaDriver* driver_ = nullptr;
  CUcontext context_ = nullptr;
  CUdevice device_ = 0;
  int ordinal_ = -1;
};

class Stream : public CuOwner<CUstream, nullptr> {
 public:
  using CuOwner::CuOwner;
  Stream(Stream&&) noexcept = default;
  Stream& operator=(Stream&&) noexcept = default;
  ~Stream();
  // A stream that does not synchronize with the legacy default stream.
  static Result<Stream> Create(const CudaDriver& driver);
  // Waits for the work queued so far, polling cuStreamQuery; DeadlineExceeded after `timeout`
  // (the work is still queued then). A sticky error is returned as the driver reports it.
  Status Synchronize(Duration timeout) const;
};

class Event : public CuOwner<CUevent, nullptr> {
 public:
  using CuOwner::CuOwner;
  Event(Event&&) noexcept = default;
  Event& operator=(Event&&) noexcept = default;
  ~Event();
  static Result<Event> Create(const CudaDriver& driver);
  Status Record(const Stream& stream) const;
  // Milliseconds from `start` to this event; both recorded and complete.
  Result<float> MillisSince(const Event& start) const;
};

class Module : public CuOwner<CUmodule, nullptr> {
 public:
  using CuOwner::CuOwner;
  Module(Module&&) noexcept = default;
  Module& operator=(Module&&) noexcept = default;
  ~Module();
  // JIT-compiles NUL-terminated PTX text; a failure carries the JIT's error log.
  static Result<Module> LoadPtx(const CudaDriver& driver, const char* ptx);
  Result<CUfunction> Function(const char* name) const;
};

class HostRegistration : public CuOwner<void*, nullptr> {
 public:
  using CuOwner::CuOwner;
  HostRegistration(HostRegistration&&) noexcept = default;
  HostRegistration& operator=(HostRegistration&&) noexcept = default;
  ~HostRegistration();
  // cuMemHostRegister(data, bytes, flags): page-locks an existing host range for DMA.
  static Result<HostRegistration> Register(const CudaDriver& driver, void* data, size_t bytes,
                                           unsigned flags);
};

class PinnedHostBuffer : public CuOwner<void*, nullptr> {
 public:
  using CuOwner::CuOwner;
  PinnedHostBuffer(PinnedHostBuffer&&) noexcept = default;
  PinnedHostBuffer& operator=(PinnedHostBuffer&&) noexcept = default;
  ~PinnedHostBuffer();
  // cuMemAllocHost: page-locked host memory, the plain pinned-copy baseline's source.
  static Result<PinnedHostBuffer> Allocate(const CudaDriver& driver, size_t bytes);
  uint8_t* data() const { return static_cast<uint8_t*>(handle_); }
};

class AllocationHandle : public CuOwner<CUmemGenericAllocationHandle, 0> {
 public:
  using CuOwner::CuOwner;
  AllocationHandle(AllocationHandle&&) noexcept = default;
  AllocationHandle& operator=(AllocationHandle&&) noexcept = default;
  ~AllocationHandle();
  static Result<AllocationHandle> Create(const CudaDriver& driver, const CUmemAllocationProp& prop,
                                         size_t bytes);
  // cuMemImportFromShareableHandle on a POSIX fd; the fd stays the caller's (close it after).
  static Result<AllocationHandle> Import(const CudaDriver& driver, int fd);
  // cuMemExportToShareableHandle as a POSIX fd, owned by the returned UniqueFd.
  Result<UniqueFd> Export() const;
};

class AddressRange : public CuOwner<CUdeviceptr, 0> {
 public:
  AddressRange() = default;
  AddressRange(AddressRange&& o) noexcept
      : CuOwner(std::move(o)), bytes_(std::exchange(o.bytes_, 0)) {}
  AddressRange& operator=(AddressRange&& o) noexcept {
    CuOwner::operator=(std::move(o));
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  ~AddressRange();
  // cuMemAddressReserve(bytes, alignment): address space only, nothing behind it.
  static Result<AddressRange> Reserve(const CudaDriver& driver, size_t bytes, size_t alignment);
  size_t bytes() const { return bytes_; }

 private:
  AddressRange(const CudaDriver* d, CUdeviceptr p, size_t bytes) : CuOwner(d, p), bytes_(bytes) {}
  size_t bytes_ = 0;
};

class MappedRange : public CuOwner<CUdeviceptr, 0> {
 public:
  MappedRange() = default;
  MappedRange(MappedRange&& o) noexcept
      : CuOwner(std::move(o)), bytes_(std::exchange(o.bytes_, 0)) {}
  MappedRange& operator=(MappedRange&& o) noexcept {
    CuOwner::operator=(std::move(o));
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  ~MappedRange();
  // cuMemMap(at, bytes, offset, handle): `offset` bytes into the allocation. No access is
  // granted yet (see SetAccess in cuda/memory/vmm.h).
  static Result<MappedRange> Map(const CudaDriver& driver, CUdeviceptr at, size_t bytes,
                                 size_t offset, const AllocationHandle& handle);
  size_t bytes() const { return bytes_; }

 private:
  MappedRange(const CudaDriver* d, CUdeviceptr p, size_t bytes) : CuOwner(d, p), bytes_(bytes) {}
  size_t bytes_ = 0;
};

}  // namespace baton

#endif  // BATON_HAVE_CUDA_HEADERS
