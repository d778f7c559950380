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

Result<std::vector<ReceivedVmmRegion>> DeviceSession::Receive(proto::Channel& channel,
                                                              uint32_t regions, Duration timeout) {
  std::vector<ReceivedVmmRegion> received;
  for (uint32_t i = 0; i < regions; ++i) {
    BATON_ASSIGN_OR_RETURN(ReceivedVmmRegion region, ReceiveVmmRegion(channel, timeout));
    received.push_back(std::move(region));
  }
  return received;
}

Result<uint64_t> DeviceSession::Refuse(const std::vector<ReceivedVmmRegion>& regions,
                                       const std::string& why, const AckFn& ack) {
  uint64_t pool_chunk_bytes = 0;
  for (const ReceivedVmmRegion& region : regions) {
    BATON_RETURN_IF_ERROR(ack(region.info.name, FailedPrecondition("declined: " + why)));
    BATON_LOG(INFO, "engine-sdk") << "declined device region '" << region.info.name << "': " << why;
    if (region.info.name == kDevicePoolRegion) pool_chunk_bytes = region.info.chunk_bytes;
  }
  return pool_chunk_bytes;
}

namespace {

DeviceSession::AckFn AckOn(proto::Channel& channel) {
  return [&channel](const std::string& region, const Status& outcome) {
    return AckVmmRegion(channel, region, outcome);
  };
}

}  // namespace

Result<uint64_t> DeviceSession::Decline(proto::Channel& channel, uint32_t regions,
                                        const std::string& why, Duration timeout) {
  BATON_ASSIGN_OR_RETURN(std::vector<ReceivedVmmRegion> received,
                         Receive(channel, regions, timeout));
  return Refuse(received, why, AckOn(channel));
}

Result<std::unique_ptr<DeviceSession>> DeviceSession::Accept(proto::Channel& channel, int device,
                                                             uint32_t regions, Duration timeout) {
  BATON_ASSIGN_OR_RETURN(std::vector<ReceivedVmmRegion> received,
                         Receive(channel, regions, timeout));
  return Take(device, std::move(received), AckOn(channel));
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

Result<std::unique_ptr<DeviceSession>> DeviceSession::Take(int device,
                                                           std::vector<ReceivedVmmRegion> regions,
                                                           const AckFn& ack) {
  Result<std::unique_ptr<DeviceBorrower>> borrower = OpenDevice(device);
  if (!borrower.ok()) {
    const Status why = borrower.status().WithContext("CUDA device " + std::to_string(device));
    BATON_RETURN_IF_ERROR(Refuse(regions, why.message(), ack).status());
    return why;
  }
  std::unique_ptr<DeviceSession> s(new DeviceSession());
  s->impl_->borrower = std::move(borrower).value();
  bool weights_read_only = true;
  for (ReceivedVmmRegion& region : regions) {
    const std::string name = region.info.name;
    Result<AcceptedRegion> taken = s->impl_->borrower->TakeRegion(std::move(region));
    BATON_RETURN_IF_ERROR(ack(name, taken.status()));
    BATON_RETURN_IF_ERROR(taken.status());
    if (name == kDeviceWeightsRegion) weights_read_only = taken->read_only;
  }
  VmmView* weights = s->impl_->borrower->view(kDeviceWeightsRegion);
  VmmView* pool = s->impl_->borrower->view(kDevicePoolRegion);
  if (weights == nullptr || pool == nullptr) {
    return InvalidArgument(
        "the controller's device regions lack '" +
        std::string(weights == nullptr ? kDeviceWeightsRegion : kDevicePoolRegion) + "'");
  }
  s->weights_ = ViewOf(device, *weights);
  s->weights_.read_only = weights_read_only;
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

Status DeviceSession::MapForReading(uint32_t first, uint32_t count, uint64_t block_bytes,
                                    uint32_t block_count) {
  Result<uint32_t> chunks =
      impl_->borrower->MapForReading(kDevicePoolRegion, first, count, block_bytes, block_count);
  if (!chunks.ok()) return chunks.status().WithContext("device pool, for reading");
  BATON_LOG(DEBUG, "engine-sdk") << "device blocks [" << first << ", +" << count << "): " << *chunks
                                 << " chunks mapped read-only";
  return OkStatus();
}

Status DeviceSession::UnmapRead() {
  return impl_->borrower->UnmapRead(kDevicePoolRegion).WithContext("device pool, read chunks");
}

#else  // !BATON_HAVE_CUDA_HEADERS

Result<std::unique_ptr<DeviceSession>> DeviceSession::Take(int,
                                                           std::vector<ReceivedVmmRegion> regions,
                                                           const AckFn& ack) {
  const Status why = Unimplemented("CUDA backend not compiled into this engine");
  BATON_RETURN_IF_ERROR(Refuse(regions, why.message(), ack).status());
  return why;
}

Status DeviceSession::MapBlocks(uint32_t, uint32_t, uint64_t, uint32_t, uint32_t, Duration) {
  return Unimplemented("CUDA backend not compiled");
}

Status DeviceSession::UnmapBlocks(uint32_t, uint32_t) {
  return Unimplemented("CUDA backend not compiled");
}

Status DeviceSession::MapForReading(uint32_t, uint32_t, uint64_t, uint32_t) {
  return Unimplemented("CUDA backend not compiled");
}

Status DeviceSession::UnmapRead() { return OkStatus(); }

#endif

}  // namespace baton
