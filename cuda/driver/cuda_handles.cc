#include "cuda/driver/cuda_handles.h"

#ifdef BATON_HAVE_CUDA_HEADERS

#include <thread>

#include "base/log.h"

namespace baton {

void WarnRelease(const CudaDriver& driver, CUresult result, const char* call) {
  if (result == CUDA_SUCCESS || result == CUDA_ERROR_DEINITIALIZED) return;
  BATON_LOG(WARN, "cuda") << driver.Check(result, call).message();
}

// --- PrimaryContext ---------------------------------------------------------------------------

PrimaryContext::~PrimaryContext() { Reset(); }

PrimaryContext::PrimaryContext(PrimaryContext&& o) noexcept
    : driver_(std::exchange(o.driver_, nullptr)),
      context_(std::exchange(o.context_, nullptr)),
      device_(o.device_),
      ordinal_(std::exchange(o.ordinal_, -1)) {}

PrimaryContext& PrimaryContext::operator=(PrimaryContext&& o) noexcept {
  if (this != &o) {
    Reset();
    driver_ = std::exchange(o.driver_, nullptr);
    context_ = std::exchange(o.context_, nullptr);
    device_ = o.device_;
    ordinal_ = std::exchange(o.ordinal_, -1);
  }
  return *this;
}

void PrimaryContext::Reset() {
  if (context_ == nullptr) return;
  WarnRelease(*driver_, driver_->api().cuDevicePrimaryCtxRelease(device_),
              "cuDevicePrimaryCtxRelease");
  context_ = nullptr;
}

Result<PrimaryContext> PrimaryContext::Retain(const CudaDriver& driver, int ordinal) {
  if (ordinal < 0 || ordinal >= driver.device_count()) {
    return InvalidArgument("CUDA device " + std::to_string(ordinal) + " does not exist (" +
                           std::to_string(driver.device_count()) + " visible)");
  }
  PrimaryContext ctx;
  ctx.driver_ = &driver;
  ctx.ordinal_ = ordinal;
  BATON_RETURN_IF_ERROR(BATON_CU(driver, cuDeviceGet, &ctx.device_, ordinal));
  CUcontext context = nullptr;
  BATON_RETURN_IF_ERROR(BATON_CU(driver, cuDevicePrimaryCtxRetain, &context, ctx.device_));
  ctx.context_ = context;
  BATON_RETURN_IF_ERROR(ctx.MakeCurrent());
  return ctx;
}

Status PrimaryContext::MakeCurrent() const {
  if (context_ == nullptr) return FailedPrecondition("no CUDA context retained");
  return BATON_CU(*driver_, cuCtxSetCurrent, context_);
}

// --- Stream, Event, Module --------------------------------------------------------------------

Stream::~Stream() {
  if (valid()) WarnRelease(*driver_, driver_->api().cuStreamDestroy(release()), "cuStreamDestroy");
}

Result<Stream> Stream::Create(const CudaDriver& driver) {
  CUstream s = nullptr;
  BATON_RETURN_IF_ERROR(BATON_CU(driver, cuStreamCreate, &s, CU_STREAM_NON_BLOCKING));
  return Stream(&driver, s);
}

Status Stream::Synchronize(Duration timeout) const {
  const TimePoint deadline = RealClock::Get().Now() + timeout;
  auto pause = std::chrono::microseconds(5);
  while (true) {
    const CUresult r = driver_->api().cuStreamQuery(handle_);
    if (r == CUDA_SUCCESS) return OkStatus();
    if (r != CUDA_ERROR_NOT_READY) return driver_->Check(r, "cuStreamQuery");
    if (RealClock::Get().Now() >= deadline) {
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count();
      return DeadlineExceeded("stream work not finished after " + std::to_string(ms) + " ms");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::microseconds(500));
  }
}

Event::~Event() {
  if (valid()) WarnRelease(*driver_, driver_->api().cuEventDestroy(release()), "cuEventDestroy");
}

Result<Event> Event::Create(const CudaDriver& driver) {
  CUevent e = nullptr;
  BATON_RETURN_IF_ERROR(BATON_CU(driver, cuEventCreate, &e, CU_EVENT_DEFAULT));
  return Event(&driver, e);
}

Status Event::Record(const Stream& stream) const {
  return BATON_CU(*driver_, cuEventRecord, handle_, stream.get());
}

Result<float> Event::MillisSince(const Event& start) const {
  float ms = 0;
  BATON_RETURN_IF_ERROR(BATON_CU(*driver_, cuEventElapsedTime, &ms, start.get(), handle_));
  return ms;
}

Module::~Module() {
  if (valid()) WarnRelease(*driver_, driver_->api().cuModuleUnload(release()), "cuModuleUnload");
}

Result<Module> Module::LoadPtx(const CudaDriver& driver, const char* ptx) {
  char error_log[4096] = {};
  CUjit_option options[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void* values[] = {error_log, reinterpret_cast<void*>(sizeof(error_log) - 1)};
  CUmodule module = nullptr;
  Status loaded = BATON_CU(driver, cuModuleLoadDataEx, &module, ptx, 2, options, values);
  if (!loaded.ok()) {
    if (error_log[0] != '\0') return loaded.WithContext(std::string("PTX JIT: ") + error_log);
    return loaded;
  }
  return Module(&driver, module);
}

Result<CUfunction> Module::Function(const char* name) const {
  CUfunction f = nullptr;
  BATON_RETURN_IF_ERROR(
      BATON_CU(*driver_, cuModuleGetFunction, &f, handle_, name).WithContext(name));
  return f;
}

// --- host memory ------------------------------------------------------------------------------

HostRegistration::~HostRegistration() {
  if (valid()) {
    WarnRelease(*driver_, driver_->api().cuMemHostUnregister(release()), "cuMemHostUnregister");
  }
}

Result<HostRegistration> HostRegistration::Register(const CudaDriver& driver, void* data,
                                                    size_t bytes, unsigned flags) {
  BATON_RETURN_IF_ERROR(BATON_CU(driver, cuMemHostRegister, data, bytes, flags));
  return HostRegistration(&driver, data);
}

PinnedHostBuffer::~PinnedHostBuffer() {
  if (valid()) WarnRelease(*driver_, driver_->api().cuMemFreeHost(release()), "cuMemFreeHost");
}

Result<PinnedHostBuffer> PinnedHostBuffer::Allocate(const CudaDriver& driver, size_t bytes) {
  void* p = nullptr;
  BATON_RETURN_IF_ERROR(BATON_CU(driver, cuMemAllocHost, &p, bytes));
  return PinnedHostBuffer(&driver, p);
}

// --- VMM --------------------------------------------------------------------------------------

AllocationHandle::~AllocationHandle() {
  if (valid()) WarnRelease(*driver_, driver_->api().cuMemRelease(release()), "cuMemRelease");
}

Result<AllocationHandle> AllocationHandle::Create(const CudaDriver& driver,
                                                  const CUmemAllocationProp& prop, size_t bytes) {
  CUmemGenericAllocationHandle h = 0;
  BATON_RETURN_IF_ERROR(BATON_CU(driver, cuMemCreate, &h, bytes, &prop, 0));
  return AllocationHandle(&driver, h);
}

Result<AllocationHandle> AllocationHandle::Import(const CudaDriver& driver, int fd) {
  CUmemGenericAllocationHandle h = 0;
  // The POSIX-fd handle type takes the fd itself, cast to a pointer.
  void* shareable = reinterpret_cast<void*>(static_cast<uintptr_t>(fd));
  BATON_RETURN_IF_ERROR(BATON_CU(driver, cuMemImportFromShareableHandle, &h, shareable,
                                 CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  return AllocationHandle(&driver, h);
}

Result<UniqueFd> AllocationHandle::Export() const {
  int fd = -1;
  BATON_RETURN_IF_ERROR(BATON_CU(*driver_, cuMemExportToShareableHandle, &fd, handle_,
                                 CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  return UniqueFd(fd);
}

AddressRange::~AddressRange() {
  if (valid()) {
    WarnRelease(*driver_, driver_->api().cuMemAddressFree(release(), bytes_), "cuMemAddressFree");
  }
}

Result<AddressRange> AddressRange::Reserve(const CudaDriver& driver, size_t bytes,
                                           size_t alignment) {
  CUdeviceptr p = 0;
  BATON_RETURN_IF_ERROR(BATON_CU(driver, cuMemAddressReserve, &p, bytes, alignment, 0, 0));
  return AddressRange(&driver, p, bytes);
}

MappedRange::~MappedRange() {
  if (valid()) WarnRelease(*driver_, driver_->api().cuMemUnmap(release(), bytes_), "cuMemUnmap");
}

Result<MappedRange> MappedRange::Map(const CudaDriver& driver, CUdeviceptr at, size_t bytes,
                                     size_t offset, const AllocationHandle& handle) {
  BATON_RETURN_IF_ERROR(BATON_CU(driver, cuMemMap, at, bytes, offset, handle.get(), 0));
  return MappedRange(&driver, at, bytes);
}

}  // namespace baton

#endif  // BATON_HAVE_CUDA_HEADERS
