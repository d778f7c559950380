#include "standby/sdk/engine_sdk.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "base/log.h"
#include "cuda/driver/cuda_errors.h"
#include "cuda/driver/gpu_backend.h"
#include "cuda/nccl/nccl_watcher.h"
#include "proto/hello.h"
#include "proto/transport/listener.h"
#include "standby/sdk/engine_session_impl.h"

namespace baton {

uint32_t TakeWholeChunks(uint32_t block_count, uint32_t per_chunk, uint32_t blocks,
                         const std::function<bool(uint32_t first, uint32_t end)>& take) {
  const uint32_t per = std::max<uint32_t>(1, per_chunk);
  uint32_t left = blocks;
  for (uint32_t end = block_count; end > 0 && left > 0;) {
    const uint32_t first = (end - 1) / per * per;
    if (end - first <= left && take(first, end)) left -= end - first;
    end = first;
  }
  return blocks - left;
}

const char* ToString(SessionEventKind kind) {
  switch (kind) {
    case SessionEventKind::kPromoted:
      return "promoted";
    case SessionEventKind::kGranted:
      return "granted";
    case SessionEventKind::kReclaim:
      return "reclaim";
    case SessionEventKind::kDrain:
      return "drain";
    case SessionEventKind::kResume:
      return "resume";
    case SessionEventKind::kStop:
      return "stop";
    case SessionEventKind::kDisconnected:
      return "disconnected";
    case SessionEventKind::kControllerLost:
      return "controller_lost";
    case SessionEventKind::kControllerBack:
      return "controller_back";
  }
  return "unknown";
}

const char* ToString(ControllerAbsentAction action) {
  switch (action) {
    case ControllerAbsentAction::kServe:
      return "serve";
    case ControllerAbsentAction::kStop:
      return "stop";
  }
  return "unknown";
}

const MappedTensor* MappedWeights::Find(std::string_view name) const {
  for (const MappedTensor& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

// --- start-up -------------------------------------------------------------------------------

EngineSession::Impl::Impl(EngineSessionOptions options)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : &RealClock::Get()) {
  if (options_.peer_name.empty()) {
    options_.peer_name = "engine-" + std::to_string(options_.launch.engine_id);
  }
  SetControllerAbsence(options_.controller_absent_timeout, options_.on_controller_absent);
}

Result<EngineSession::Impl::FileIdentity> EngineSession::Impl::IdentityOf(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return ErrnoStatus("fstat of a memfd from the controller", errno);
  return FileIdentity{.dev = static_cast<uint64_t>(st.st_dev),
                      .ino = static_cast<uint64_t>(st.st_ino)};
}

proto::ChannelOptions EngineSession::Impl::ChannelOptionsForController() const {
  return proto::ChannelOptions{
      .max_frame_size = proto::kControllerMaxFrameSize, .label = "controller", .clock = clock_};
}

EngineSession::Impl::~Impl() { Shutdown(); }

Status EngineSession::Impl::Handshake() {
  if (options_.launch.socket_path.empty()) return InvalidArgument("no controller socket path");
  const proto::ChannelOptions channel_options = ChannelOptionsForController();
  const TimePoint deadline = clock_->Now() + options_.connect_timeout;
  Result<proto::Channel> channel = Unavailable("not tried");
  while (true) {
    channel = proto::Connect(io_, options_.launch.socket_path, channel_options);
    if (channel.ok() || clock_->Now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!channel.ok()) return channel.status().WithContext("connecting to the controller");
  channel_.emplace(std::move(channel).value());
  proto::ClientHelloOptions hello{.peer_name = options_.peer_name,
                                  .role = proto::PeerRole::kEngine,
                                  .launch_token = options_.launch.launch_token};
  if (!options_.handles_resume) hello.max_version = proto::kProtocolVersionResume - 1;
  BATON_ASSIGN_OR_RETURN(proto::HelloAck said, proto::ClientHello(*channel_, hello));
  protocol_.store(said.version);
  BATON_RETURN_IF_ERROR(channel_->Send(proto::Register{
      .engine_id = options_.launch.engine_id,
      .engine_version = options_.engine_version,
      .http_address = options_.http_address,
  }));
  return ReceiveRegisterAck();
}

Status EngineSession::Impl::ReceiveRegisterAck() {
  BATON_ASSIGN_OR_RETURN(proto::ReceivedMessage msg, channel_->Receive(options_.connect_timeout));
  if (msg.type == proto::MsgType::kStop) {
    BATON_ASSIGN_OR_RETURN(proto::Stop stop, msg.As<proto::Stop>());
    return FailedPrecondition("the controller refused the registration: " + stop.reason);
  }
  BATON_ASSIGN_OR_RETURN(proto::RegisterAck ack, msg.As<proto::RegisterAck>());
  // A partial weight arena (protocol 8) comes in two memfds: the third fd is its 4 KiB part.
  const size_t max_fds = protocol_.load() >= proto::kProtocolVersionPartialArena ? 3 : 2;
  if (msg.fds.size() < 2 || msg.fds.size() > max_fds) {
    return InvalidArgument("RegisterAck carries " + std::to_string(msg.fds.size()) +
                           " fds; expected 2 (arena, pool)" +
                           (max_fds == 3 ? " or 3 (arena, pool, arena's 4 KiB part)" : ""));
  }
  if (ack.engine_id != options_.launch.engine_id) {
    return InvalidArgument("RegisterAck names engine " + std::to_string(ack.engine_id) +
                           ", this is engine " + std::to_string(options_.launch.engine_id));
  }
  if (ack.heartbeat_interval_ms == 0) return InvalidArgument("RegisterAck: heartbeat interval 0");
  heartbeat_interval_ = std::chrono::milliseconds(ack.heartbeat_interval_ms);
  beat_every_ns_.store(std::chrono::duration_cast<Duration>(heartbeat_interval_).count());
  // Which memory this engine maps: a Reattach names it to the next controller.
  BATON_ASSIGN_OR_RETURN(arena_id_, IdentityOf(msg.fds[0].get()));
  BATON_ASSIGN_OR_RETURN(pool_id_, IdentityOf(msg.fds[1].get()));
  // The device regions follow the ack on the channel: taken off it now, mapped later, while
  // the heartbeat thread owns the channel.
  BATON_ASSIGN_OR_RETURN(
      std::vector<ReceivedVmmRegion> regions,
      DeviceSession::Receive(*channel_, ack.device_regions, options_.connect_timeout));
  pending_ =
      PendingMemory{.ack = std::move(ack),
                    .arena_fd = std::move(msg.fds[0]),
                    .arena_second_fd = msg.fds.size() > 2 ? std::move(msg.fds[2]) : UniqueFd(),
                    .pool_fd = std::move(msg.fds[1]),
                    .device_regions = std::move(regions)};
  return OkStatus();
}

Status EngineSession::Impl::TakeMemory() {
  if (!pending_.has_value()) return FailedPrecondition("no RegisterAck to take the memory of");
  PendingMemory pending = std::move(*pending_);
  pending_.reset();
  BATON_RETURN_IF_ERROR(
      MapWeights(pending.ack, std::move(pending.arena_fd), std::move(pending.arena_second_fd)));
  BATON_RETURN_IF_ERROR(ReservePool(pending.ack, std::move(pending.pool_fd)));
  return TakeDeviceRegions(pending.ack, std::move(pending.device_regions));
}

Status EngineSession::Impl::TakeDeviceRegions(const proto::RegisterAck& ack,
                                              std::vector<ReceivedVmmRegion> regions) {
  if (regions.empty()) return OkStatus();
  const DeviceSession::AckFn send_ack = [this](const std::string& region, const Status& outcome) {
    return Send(proto::ShareMemoryAck{
        .name = region, .mapped = outcome.ok(), .detail = outcome.ok() ? "" : outcome.ToString()});
  };
  if (!options_.use_device_memory) {
    BATON_ASSIGN_OR_RETURN(
        declined_pool_chunk_bytes_,
        DeviceSession::Refuse(regions, "this engine computes on the host", send_ack));
    return OkStatus();
  }
  Result<std::unique_ptr<DeviceSession>> device =
      DeviceSession::Take(ack.device, std::move(regions), send_ack);
  if (!device.ok()) return device.status().WithContext("taking the device memory");
  MutexLock lock(mu_);
  device_ = std::move(device).value();
  BATON_LOG(INFO, "engine-sdk") << "device " << ack.device << ": weights mapped "
                                << (device_->weights().read_only
                                        ? "read-only"
                                        : "read-write (the driver refused read-only access)")
                                << " at 0x" << std::hex << device_->weights().address
                                << ", pool reserved at 0x" << device_->pool().address << std::dec
                                << " (" << device_->pool().chunks << " chunks of "
                                << device_->pool().chunk_bytes << " bytes)";
  return OkStatus();
}

// A partial arena's two memfds are mapped back to back, so that offsets span both.
Status EngineSession::Impl::MapWeights(const proto::RegisterAck& ack, UniqueFd arena_fd,
                                       UniqueFd second_fd) {
  BATON_ASSIGN_OR_RETURN(arena_, SharedMemory::Import(std::move(arena_fd)));
  if (second_fd.valid()) {
    BATON_ASSIGN_OR_RETURN(arena_second_, SharedMemory::Import(std::move(second_fd)));
  }
  if (arena_.size() + arena_second_.size() < ack.arena_size) {
    return InvalidArgument("weight arena fds hold " +
                           std::to_string(arena_.size() + arena_second_.size()) +
                           " bytes, the table says " + std::to_string(ack.arena_size));
  }
  BATON_ASSIGN_OR_RETURN(arena_map_, MapBackToBack(arena_, arena_second_, Protection::kReadOnly));
  weights_.model = ack.model;
  weights_.base = arena_map_.data();
  weights_.size = ack.arena_size;
  weights_.huge_pages = ack.arena_huge_pages;
  for (const proto::TensorEntry& e : ack.tensors) {
    if (!IsValidDType(e.dtype)) {
      return InvalidArgument("tensor " + e.name + ": unknown dtype " + std::to_string(e.dtype));
    }
    if (e.offset > ack.arena_size || e.size > ack.arena_size - e.offset) {
      return InvalidArgument("tensor " + e.name + " lies outside the arena");
    }
    weights_.tensors.push_back(MappedTensor{.name = e.name,
                                            .dtype = static_cast<DType>(e.dtype),
                                            .shape = e.shape,
                                            .data = weights_.base + e.offset,
                                            .size = e.size});
  }
  return OkStatus();
}

Status EngineSession::Impl::ReservePool(const proto::RegisterAck& ack, UniqueFd pool_fd) {
  PoolGeometryArgs args{.block_count = ack.block_count,
                        .block_bytes = ack.block_bytes,
                        .reserve_bytes = ack.reserve_bytes,
                        .huge_pages = ack.pool_huge_pages};
  BATON_ASSIGN_OR_RETURN(PoolMapping pool, PoolMapping::Reserve(std::move(pool_fd), args));
  MutexLock lock(mu_);
  pool_ = std::move(pool);
  pool_view_ = PoolView{.block_count = pool_.block_count(),
                        .block_bytes = pool_.block_bytes(),
                        .huge_pages = pool_.huge_pages(),
                        .base = pool_.base(),
                        .reserved_bytes = pool_.reserved_bytes()};
  return OkStatus();
}

// In slices: MADV_POPULATE_READ holds the process's mmap lock for the whole range it is given,
// and the heartbeat thread waits for that lock whenever it maps memory (its first malloc
// makes its arena with mmap): one call over a large arena on 4 KiB pages silences the
// heartbeats for as long as the pre-fault takes, and the controller fences the engine as
// hung. Between slices the lock is let go, so the heartbeat thread waits one slice at most.
Status EngineSession::Impl::Prefault() {
  if (!options_.prefault_weights || arena_map_.size() == 0) return OkStatus();
  const TimePoint start = clock_->Now();
#ifdef MADV_POPULATE_READ
  bool populated = true;
  for (size_t at = 0; at < arena_map_.size() && populated; at += kPrefaultSliceBytes) {
    const size_t n = std::min(kPrefaultSliceBytes, arena_map_.size() - at);
    populated = ::madvise(arena_map_.data() + at, n, MADV_POPULATE_READ) == 0;
  }
  if (populated) {
    weights_.prefault_ms = MillisBetween(start, clock_->Now());
    return OkStatus();
  }
#endif
  // Older kernels: read one byte of every page.
  const size_t page = arena_.huge_pages() && arena_second_.size() == 0
                          ? kHugePageSize
                          : static_cast<size_t>(getpagesize());
  const volatile uint8_t* bytes = arena_map_.data();
  uint8_t sum = 0;
  for (size_t off = 0; off < arena_map_.size(); off += page) sum = sum ^ bytes[off];
  touched_ = sum;
  weights_.prefault_ms = MillisBetween(start, clock_->Now());
  return OkStatus();
}

void EngineSession::Impl::PrefaultHeaderView() {
  const TimePoint start = clock_->Now();
  uint32_t blocks = 0;
  {
    MutexLock lock(mu_);
    Status mapped = pool_.MapHeaderView();
    if (!mapped.ok()) {
      BATON_LOG(WARN, "engine-sdk") << "pool header view: " << mapped.message()
                                    << ": a promotion reads the old primary's headers with pread";
      return;
    }
    blocks = pool_.block_count();
  }
  constexpr uint32_t kSlice = 512;
  for (uint32_t at = 0; at < blocks; at += kSlice) {
    MutexLock lock(mu_);
    pool_.PrefaultHeaderView(at, std::min(kSlice, blocks - at));
  }
  header_view_ms_ = MillisBetween(start, clock_->Now());
}

Status EngineSession::Impl::SendReady() {
  const proto::StandbyReady ready{
      .arena_mapped_bytes = arena_map_.size(),
      .reserved_bytes = pool_view_.reserved_bytes,
      .prefault_us = static_cast<uint64_t>(weights_.prefault_ms * 1000.0),
  };
  return Send(ready, LivenessFds());
}

// --- EngineSession ----------------------------------------------------------------------------

Result<std::unique_ptr<EngineSession>> EngineSession::Connect(const EngineSessionOptions& options) {
  auto impl = std::make_unique<Impl>(options);
  const std::string who = "engine " + std::to_string(options.launch.engine_id);
  BATON_RETURN_IF_ERROR(impl->Handshake().WithContext(who + " registering"));
  // Heartbeats from here on: the controller's hang detection covers the registration, and
  // mapping and pre-faulting a large arena, or making a CUDA context, takes what it takes.
  BATON_RETURN_IF_ERROR(impl->StartThread());
  BATON_RETURN_IF_ERROR(impl->TakeMemory().WithContext(who + " registering"));
  BATON_RETURN_IF_ERROR(impl->Prefault());
  impl->PrefaultHeaderView();
  if (!options.ready_when_waiting) {
    BATON_RETURN_IF_ERROR(impl->SendReady().WithContext(who + " reporting ready"));
    impl->MarkRegistered();
  }
  BATON_LOG(INFO, "engine-sdk") << who << " registered: " << impl->weights().tensors.size()
                                << " tensors of the host arena mapped read-only ("
                                << impl->weights().size << " bytes, pre-faulted in "
                                << impl->weights().prefault_ms << " ms), pool range of "
                                << impl->pool().block_count << " blocks reserved"
                                << impl->HeaderViewText();
  return std::unique_ptr<EngineSession>(new EngineSession(std::move(impl)));
}

EngineSession::EngineSession(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
EngineSession::~EngineSession() { Shutdown(); }

uint64_t EngineSession::engine_id() const { return impl_->engine_id(); }
const MappedWeights& EngineSession::weights() const { return impl_->weights(); }
const PoolView& EngineSession::pool() const { return impl_->pool(); }
std::optional<DeviceRegionView> EngineSession::device_weights() const {
  return impl_->device_weights();
}
std::optional<DeviceRegionView> EngineSession::device_pool() const { return impl_->device_pool(); }
uint32_t EngineSession::reclaim_chunk_blocks() const {
  const std::optional<DeviceRegionView> device = impl_->device_pool();
  const uint64_t chunk_bytes =
      device.has_value() ? device->chunk_bytes : impl_->declined_pool_chunk_bytes();
  const uint64_t block_bytes = pool().block_bytes;
  if (block_bytes == 0 || chunk_bytes < block_bytes) return 1;
  return static_cast<uint32_t>(chunk_bytes / block_bytes);
}
Result<SessionEvent> EngineSession::WaitForPromotion(std::optional<Duration> timeout) {
  return impl_->WaitForPromotion(timeout);
}
Status EngineSession::MarkServing() { return impl_->MarkServing(); }
std::optional<SessionEvent> EngineSession::NextEvent(std::optional<Duration> timeout) {
  return impl_->NextEvent(timeout);
}
Status EngineSession::RequestBlocks(uint32_t blocks) { return impl_->RequestBlocks(blocks); }
Status EngineSession::ReturnBlocks(std::span<const MappedExtent> extents) {
  return impl_->ReturnBlocks(extents);
}
Status EngineSession::ReportDrained(uint32_t unfinished) {
  return impl_->ReportDrained(unfinished);
}
Status EngineSession::ReportKvAdoption(const KvAdoptionSummary& summary) {
  return impl_->ReportKvAdoption(summary);
}
bool EngineSession::resume_pending() const { return impl_->resume_pending(); }
Status EngineSession::ReportError(const Status& error) { return impl_->ReportError(error); }
uint64_t EngineSession::epoch() const { return impl_->epoch(); }
Status EngineSession::CheckEpoch() const { return impl_->CheckEpoch(); }
std::vector<MappedExtent> EngineSession::extents() const { return impl_->extents(); }
uint64_t EngineSession::heartbeats_sent() const { return impl_->heartbeats_sent(); }
void EngineSession::ReportProgress(uint64_t steps_done, uint32_t work_pending) {
  impl_->ReportProgress(steps_done, work_pending);
}
uint64_t EngineSession::progress_sent() const { return impl_->progress_sent(); }
void EngineSession::SetControllerAbsence(Duration timeout, ControllerAbsentAction action) {
  impl_->SetControllerAbsence(timeout, action);
}
void EngineSession::Shutdown() {
  {
    // The watcher calls into the session: it goes first. Watched communicators stay the
    // engine's (a clean shutdown is no fence).
    MutexLock lock(nccl_mu_);
    nccl_.reset();
  }
  if (impl_) impl_->Shutdown();
}

// --- GPU engines --------------------------------------------------------------------------------

Status EngineSession::WatchNcclComm(void* comm, const std::string& label) {
  MutexLock lock(nccl_mu_);
  if (nccl_ == nullptr) {
    BATON_ASSIGN_OR_RETURN(const NcclLibrary* nccl, NcclLibrary::Get());
    BATON_LOG(INFO, "engine-sdk") << "watching NCCL communicators (NCCL " << nccl->version_string()
                                  << ")";
    nccl_ = std::make_unique<NcclWatcher>(
        NcclApi::FromLibrary(*nccl),
        NcclWatcherOptions{.report = [this](const Status& error) { (void)ReportError(error); },
                           .fenced = [this] { return CheckEpoch(); }});
  }
  return nccl_->Register(comm, label);
}

Status EngineSession::UnwatchNcclComm(void* comm) {
  MutexLock lock(nccl_mu_);
  if (nccl_ == nullptr) return NotFound("no NCCL communicator is watched");
  return nccl_->Unregister(comm);
}

Status EngineSession::ReportCudaError(int cuda_result, const std::string& where) {
  if (cuda_result == 0) return OkStatus();
  const Status error(CudaStatusCode(cuda_result), where + ": " + DescribeCudaError(cuda_result));
  if (!IsStickyCudaError(cuda_result)) return error;
  const Status reported = ReportError(error.WithContext("sticky CUDA error"));
  if (!reported.ok()) {
    BATON_LOG(ERROR, "engine-sdk")
        << "could not report " << error.message() << ": " << reported.message();
  }
  return error;
}

}  // namespace baton
