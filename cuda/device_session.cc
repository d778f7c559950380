#include "cuda/device_session.h"

#include "base/log.h"
#include "cuda/memory/vmm_share.h"

#ifdef BATON_HAVE_CUDA_HEADERS
#include "cuda/device_borrower.h"
#include "cuda/driver/cuda_driver.h"
#endif

namespace baton {

#ifdef BATON_HAVE_CUDA_HEADERS
struct DeviceSession::Impl {
  std::unique_ptr<DeviceBorrower> borrower;
};
#else
struct DeviceSession::Impl {};
#endif

DeviceSession::DeviceSession() : impl_(std::make_unique<Impl>()) {}
DeviceSession::~DeviceSession() = default;

Result<uint64_t> DeviceSession::Decline(proto::Channel& channel, uint32_t regions,
                                        const std::string& why, Duration timeout) {
  uint64_t pool_chunk_bytes = 0;
  for (uint32_t i = 0; i < regions; ++i) {
    BATON_ASSIGN_OR_RETURN(ReceivedVmmRegion region, ReceiveVmmRegion(channel, timeout));
    BATON_RETURN_IF_ERROR(
        AckVmmRegion(channel, region.info.name, FailedPrecondition("declined: " + why)));
    BATON_LOG(INFO, "engine-sdk") << "declined device region '" << region.info.name << "': " << why;
    if (region.info.name == kDevicePoolRegion) pool_chunk_bytes = region.info.chunk_bytes;
  }
  return pool_chunk_bytes;
}

#ifdef BATON_HAVE_CUDA_HEADERS

namespace {

DeviceRegionView ViewOf(int device, const VmmView& v) {
  return DeviceRegionView{.device = device,
                          .address = static_cast<uint64_t>(v.base()),
                          .bytes = v.bytes(),
                          .chunk_bytes = v.chunk_bytes(),
                          .chunks = static_cast<uint32_t>(v.chunk_count())};
}

Result<std::unique_ptr<DeviceBorrower>> OpenDevice(int device) {
  BATON_ASSIGN_OR_RETURN(const CudaDriver* driver, CudaDriver::Get());
  return DeviceBorrower::Create(*driver, device);
}

}  // namespace

Result<std::unique_ptr<DeviceSession>> DeviceSession::Accept(proto::Channel& channel, int device,
                                                             uint32_t regions, Duration timeout) {
  Result<std::unique_ptr<DeviceBorrower>> borrower = OpenDevice(device);
  if (!borrower.ok()) {
    const Status why = borrower.status().WithContext("CUDA device " + std::to_string(device));
    BATON_RETURN_IF_ERROR(Decline(channel, regions, why.message(), timeout).status());
    return why;
  }
  std::unique_ptr<DeviceSession> s(new DeviceSession());
  s->impl_->borrower = std::move(borrower).value();
  for (uint32_t i = 0; i < regions; ++i) {
    BATON_RETURN_IF_ERROR(s->impl_->borrower->AcceptRegion(channel, timeout).status());
  }
  VmmView* weights = s->impl_->borrower->view(kDeviceWeightsRegion);
  VmmView* pool = s->impl_->borrower->view(kDevicePoolRegion);
  if (weights == nullptr || pool == nullptr) {
    return InvalidArgument(
        "the controller's device regions lack '" +
        std::string(weights == nullptr ? kDeviceWeightsRegion : kDevicePoolRegion) + "'");
  }
  s->weights_ = ViewOf(device, *weights);
  s->pool_ = ViewOf(device, *pool);
  return s;
}

Status DeviceSession::MapBlocks(uint32_t first, uint32_t count, uint64_t block_bytes,
                                uint32_t block_count, uint32_t header_bytes, Duration timeout) {
  Result<PromotionPhases> phases = impl_->borrower->MapBlocks(
      kDevicePoolRegion, first, count, block_bytes, block_count, header_bytes, timeout);
  if (!phases.ok()) return phases.status().WithContext("device pool");
  BATON_LOG(DEBUG, "engine-sdk") << "device blocks [" << first << ", +" << count
                                 << "): " << phases->map_calls << " chunks mapped in "
                                 << phases->map_ms << " ms, headers scrubbed in "
                                 << phases->scrub_ms << " ms";
  return OkStatus();
}

Status DeviceSession::UnmapBlocks(uint32_t first, uint32_t count) {
  return impl_->borrower->UnmapBlocks(kDevicePoolRegion, first, count).WithContext("device pool");
}

#else  // !BATON_HAVE_CUDA_HEADERS

Result<std::unique_ptr<DeviceSession>> DeviceSession::Accept(proto::Channel& channel, int,
                                                             uint32_t regions, Duration timeout) {
  const Status why = Unimplemented("CUDA backend not compiled into this engine");
  BATON_RETURN_IF_ERROR(Decline(channel, regions, why.message(), timeout).status());
  return why;
}

Status DeviceSession::MapBlocks(uint32_t, uint32_t, uint64_t, uint32_t, uint32_t, Duration) {
  return Unimplemented("CUDA backend not compiled");
}

Status DeviceSession::UnmapBlocks(uint32_t, uint32_t) {
  return Unimplemented("CUDA backend not compiled");
}

#endif

}  // namespace baton
