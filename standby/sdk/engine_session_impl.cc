#include "standby/sdk/engine_session_impl.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <future>
#include <map>
#include <system_error>

#include "base/log.h"

namespace baton {
namespace {

constexpr const char* kLog = "engine-sdk";

int MillisUntil(TimePoint now, TimePoint when) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(when - now).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 60'000));
}

// Checks that every extent lies inside the mapped blocks and that no block is listed twice,
// so that ReturnBlocks unmaps all of a list or none of it.
Status CheckReturnable(std::map<uint32_t, uint32_t> left, std::span<const MappedExtent> extents) {
  for (const MappedExtent& e : extents) {
    auto it = left.upper_bound(e.first);
    const bool inside =
        e.count > 0 && it != left.begin() &&
        e.first + uint64_t{e.count} <= std::prev(it)->first + uint64_t{std::prev(it)->second};
    if (!inside) {
      return FailedPrecondition("ReturnBlocks: blocks [" + std::to_string(e.first) + ", " +
                                std::to_string(uint64_t{e.first} + e.count) +
                                ") are not all mapped, or are listed twice; nothing returned");
    }
    --it;
    const uint32_t run_first = it->first;
    const uint32_t run_end = it->first + it->second;
    left.erase(it);
    if (e.first > run_first) left[run_first] = e.first - run_first;
    if (e.first + e.count < run_end) left[e.first + e.count] = run_end - (e.first + e.count);
  }
  return OkStatus();
}

}  // namespace

// --- heartbeat thread ---------------------------------------------------------------------------

Status EngineSession::Impl::StartThread() {
  const int fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (fd < 0) return ErrnoStatus("eventfd", errno);
  wake_fd_ = UniqueFd(fd);
  if (Result<proto::LivenessPage> page = proto::LivenessPage::Create(); page.ok()) {
    liveness_ = std::move(page).value();
  } else {
    BATON_LOG(WARN, kLog) << "no liveness page (" << page.status().ToString()
                          << "): the controller sees this engine's death by its connection";
  }
  // The thread holds the page's mutex before the page is sent (SendReady): a death from then
  // on is seen at once.
  std::promise<void> holding;
  std::future<void> held = holding.get_future();
  try {
    thread_ = std::thread([this, holding = std::move(holding)]() mutable {
      if (Status hold = liveness_.Hold(); !hold.ok() && liveness_.valid()) {
        BATON_LOG(WARN, kLog) << hold.ToString();
        liveness_ = proto::LivenessPage();
      }
      holding.set_value();
      Run();
      liveness_.Release();
    });
  } catch (const std::system_error& e) {
    return Status(StatusCode::kResourceExhausted,
                  std::string("starting the heartbeat thread: ") + e.what());
  }
  held.wait();
  return OkStatus();
}

std::vector<int> EngineSession::Impl::LivenessFds() const {
  if (!liveness_.valid()) return {};
  return {liveness_.fd()};
}

Status EngineSession::Impl::ServeAttached() {
  // Frames that came in with the last handshake reply are buffered: take them first.
  BATON_RETURN_IF_ERROR(PumpMessages());
  next_beat_ns_.store(0);
  while (!stopping_.load()) {
    BeatIfDue();
    const TimePoint next_beat{Duration(next_beat_ns_.load())};
    // Read each round: a send that failed on another thread closes the channel, and its fd
    // number may already belong to another socket of the engine.
    int socket_fd = -1;
    {
      MutexLock lock(channel_mu_);
      if (channel_.has_value() && channel_->is_open()) socket_fd = channel_->native_handle();
    }
    if (socket_fd < 0) return Unavailable("the connection to the controller is closed");
    pollfd fds[2] = {{.fd = socket_fd, .events = POLLIN, .revents = 0},
                     {.fd = wake_fd_.get(), .events = POLLIN, .revents = 0}};
    const int n = ::poll(fds, 2, MillisUntil(clock_->Now(), next_beat));
    if (n < 0 && errno != EINTR) return ErrnoStatus("poll", errno);
    if (n <= 0) continue;
    if (fds[1].revents != 0) {
      uint64_t drained;
      ssize_t unused = ::read(wake_fd_.get(), &drained, sizeof(drained));
      (void)unused;
    }
    if (fds[0].revents != 0) BATON_RETURN_IF_ERROR(PumpMessages());
  }
  return OkStatus();
}

Status EngineSession::Impl::PumpMessages() {
  while (true) {
    Result<std::optional<proto::ReceivedMessage>> next = Unavailable("no channel");
    {
      MutexLock lock(channel_mu_);
      if (channel_.has_value()) next = channel_->TryReceive();
    }
    if (!next.ok()) return next.status();
    if (!next->has_value()) return OkStatus();
    Handle(**next);
  }
}

void EngineSession::Impl::BeatIfDue() {
  const int64_t now = clock_->Now().time_since_epoch().count();
  int64_t due = next_beat_ns_.load();
  if (now < due) return;
  const int64_t next = now + beat_every_ns_.load();
  if (next_beat_ns_.compare_exchange_strong(due, next)) SendHeartbeat();
}

void EngineSession::Impl::SendHeartbeat() {
  const uint64_t seq = heartbeat_seq_.fetch_add(1) + 1;
  Status sent = Send(proto::Heartbeat{.epoch = epoch_.load(), .seq = seq});
  if (!sent.ok()) {
    BATON_LOG(DEBUG, kLog) << "heartbeat " << seq << ": " << sent.ToString();
    return;
  }
  if (!progress_reported_.load() || protocol_.load() < proto::kProtocolVersionProgress) return;
  sent = Send(proto::Progress{.epoch = epoch_.load(),
                              .steps_done = progress_steps_.load(std::memory_order_relaxed),
                              .work_pending = progress_pending_.load(std::memory_order_relaxed)});
  if (sent.ok()) progress_sent_.fetch_add(1);
}

void EngineSession::Impl::Handle(const proto::ReceivedMessage& msg) {
  using proto::MsgType;
  switch (msg.type) {
    case MsgType::kHealthRequest:
      SendHeartbeat();
      return;
    case MsgType::kPromote:
      if (auto m = msg.As<proto::Promote>(); m.ok()) {
        return OnPromote(*m);
      }
      break;
    case MsgType::kGrant:
      if (auto m = msg.As<proto::Grant>(); m.ok()) {
        return OnGrant(*m);
      }
      break;
    case MsgType::kQuarantined:
      if (auto m = msg.As<proto::Quarantined>(); m.ok()) {
        return OnQuarantined(*std::move(m));
      }
      break;
    case MsgType::kReclaim:
      if (auto m = msg.As<proto::Reclaim>(); m.ok()) {
        return Push(SessionEvent{
            .kind = SessionEventKind::kReclaim, .epoch = m->epoch, .blocks = m->blocks});
      }
      break;
    case MsgType::kDrain:
      if (auto m = msg.As<proto::Drain>(); m.ok()) {
        return OnDrain(m->epoch, m->timeout_ms, /*successor=*/true);
      }
      break;
    case MsgType::kFinalDrain:
      if (auto m = msg.As<proto::FinalDrain>(); m.ok()) {
        return OnDrain(m->epoch, m->timeout_ms, /*successor=*/false);
      }
      break;
    case MsgType::kResume:
      if (auto m = msg.As<proto::Resume>(); m.ok()) {
        SetDrain(DrainState::kNone);  // serving again (also after Drained was reported)
        resume_pending_ = true;
        return Push(SessionEvent{.kind = SessionEventKind::kResume, .epoch = m->epoch});
      }
      break;
    case MsgType::kStop:
      if (auto m = msg.As<proto::Stop>(); m.ok()) {
        return OnStop(m->reason);
      }
      break;
    case MsgType::kInjectFault:
      if (auto m = msg.As<proto::InjectFault>(); m.ok()) {
        (void)ReportError(Internal("injected fault (" + m->kind + "): " + m->message));
        return;
      }
      break;
    case MsgType::kErrorMsg: {
      auto m = msg.As<proto::ErrorMsg>();
      BATON_LOG(WARN, kLog) << "controller refused a request: "
                            << (m.ok() ? m->message : m.status().message());
      return;
    }
    default:
      BATON_LOG(WARN, kLog) << "ignoring unexpected " << proto::MsgTypeName(msg.type)
                            << " from the controller";
      return;
  }
  BATON_LOG(WARN, kLog) << "ignoring malformed " << proto::MsgTypeName(msg.type)
                        << " from the controller";
}

void EngineSession::Impl::OnDrain(uint64_t epoch, uint32_t timeout_ms, bool successor) {
  {
    MutexLock lock(mu_);
    drain_ = DrainState::kDraining;
    ++drains_unanswered_;
  }
  Push(SessionEvent{.kind = SessionEventKind::kDrain,
                    .epoch = epoch,
                    .timeout = std::chrono::milliseconds(timeout_ms),
                    .successor = successor});
}

void EngineSession::Impl::OnStop(const std::string& reason) {
  BATON_LOG(WARN, kLog) << "the controller asks this engine to stop: " << reason;
  {
    MutexLock lock(mu_);
    stopped_ = reason.empty() ? "stop requested" : reason;
  }
  Push(SessionEvent{.kind = SessionEventKind::kStop, .epoch = epoch_.load(), .reason = reason});
}

void EngineSession::Impl::OnDisconnected(const std::string& reason) {
  if (stopping_.load()) return;
  BATON_LOG(WARN, kLog) << "the session ends without a controller: " << reason;
  {
    MutexLock lock(mu_);
    disconnected_ = reason;
  }
  Push(SessionEvent{.kind = SessionEventKind::kDisconnected, .reason = reason});
}

void EngineSession::Impl::Refuse(const Status& status) {
  BATON_LOG(WARN, kLog) << status.message();
  (void)Send(proto::ErrorMsg::FromStatus(status));
}

void EngineSession::Impl::Push(SessionEvent event) {
  {
    MutexLock lock(mu_);
    events_.push_back(std::move(event));
  }
  cv_.NotifyAll();
}

// --- public API ---------------------------------------------------------------------------------

Status EngineSession::Impl::SendDeferredReady() {
  if (!options_.ready_when_waiting || ready_sent_.exchange(true)) return OkStatus();
  BATON_RETURN_IF_ERROR(
      SendReady().WithContext("engine " + std::to_string(engine_id()) + " reporting ready"));
  MarkRegistered();
  BATON_LOG(INFO, kLog) << "engine " << engine_id() << " ready as a standby (waiting for its "
                        << "promotion)";
  return OkStatus();
}

Result<SessionEvent> EngineSession::Impl::WaitForPromotion(std::optional<Duration> timeout) {
  const Status ready = SendDeferredReady();
  // A StandbyReady that cannot be sent is a lost controller: this session, never counted a
  // standby, does not reattach (FailedPrecondition, as for any standby whose session ended).
  if (!ready.ok())
    return FailedPrecondition("not promoted: controller connection lost: " +
                              std::string(ready.message()));
  MutexLock lock(mu_);
  const auto deadline = std::chrono::steady_clock::now() + timeout.value_or(Duration::zero());
  while (true) {
    for (auto it = events_.begin(); it != events_.end(); ++it) {
      if (it->kind == SessionEventKind::kPromoted) {
        SessionEvent event = std::move(*it);
        events_.erase(it);
        promotion_taken_ = true;
        return event;
      }
      if (it->kind == SessionEventKind::kStop || it->kind == SessionEventKind::kDisconnected) {
        return FailedPrecondition("not promoted: " + std::string(ToString(it->kind)) + ": " +
                                  it->reason);
      }
    }
    if (promotion_taken_) {
      return FailedPrecondition("already promoted at epoch " + std::to_string(epoch_.load()) +
                                ": take later events with NextEvent");
    }
    if (failed_.has_value()) return FailedPrecondition("not promoted: " + *failed_);
    if (stopped_.has_value()) return FailedPrecondition("not promoted: told to stop: " + *stopped_);
    if (disconnected_.has_value()) {
      return FailedPrecondition("not promoted: controller connection lost: " + *disconnected_);
    }
    if (!timeout.has_value()) {
      cv_.Wait(mu_);
    } else if (cv_.WaitUntil(mu_, deadline) == std::cv_status::timeout) {
      return DeadlineExceeded("not promoted within the timeout");
    }
  }
}

Status EngineSession::Impl::MarkServing() {
  uint32_t blocks;
  {
    MutexLock lock(mu_);
    if (!promoted_) return FailedPrecondition("MarkServing before promotion");
    serving_ = true;
    blocks = pool_.mapped_blocks();
  }
  cv_.NotifyAll();  // a Grant held back until now (OnGrant)
  return SendOrDefer(proto::PromoteAck{.epoch = epoch_.load(), .blocks_mapped = blocks});
}

std::optional<SessionEvent> EngineSession::Impl::NextEvent(std::optional<Duration> timeout) {
  MutexLock lock(mu_);
  const auto deadline = std::chrono::steady_clock::now() + timeout.value_or(Duration::zero());
  while (events_.empty()) {
    if (!timeout.has_value()) {
      cv_.Wait(mu_);
    } else if (cv_.WaitUntil(mu_, deadline) == std::cv_status::timeout) {
      if (events_.empty()) return std::nullopt;
    }
  }
  SessionEvent event = std::move(events_.front());
  events_.pop_front();
  if (event.kind == SessionEventKind::kResume) resume_pending_ = false;
  if (event.kind == SessionEventKind::kPromoted) promotion_taken_ = true;
  return event;
}

Status EngineSession::Impl::RequestBlocks(uint32_t blocks) {
  BATON_RETURN_IF_ERROR(CheckEpoch());
  if (blocks == 0) return InvalidArgument("RequestBlocks(0)");
  {
    MutexLock lock(mu_);
    if (!promoted_)
      return FailedPrecondition("RequestBlocks: not promoted (a standby has no lease)");
  }
  return Send(proto::LeaseRequest{.epoch = epoch_.load(), .blocks = blocks});
}

Status EngineSession::Impl::ReturnBlocks(std::span<const MappedExtent> extents) {
  proto::ReturnExtents msg{.epoch = epoch_.load(), .extents = {}};
  Status unmapped = OkStatus();
  {
    MutexLock lock(mu_);
    BATON_RETURN_IF_ERROR(CheckReturnable(pool_.mapped(), extents));
    for (const MappedExtent& e : extents) {
      unmapped = UnmapBlocksLocked(e.first, e.count).WithContext("ReturnBlocks");
      if (!unmapped.ok()) break;  // what is unmapped already is still told to the controller
      msg.extents.push_back(proto::BlockRange{.first = e.first, .count = e.count});
    }
  }
  // Empty too: the answer to a Reclaim with nothing to give. While the controller is away the
  // blocks are simply not reported: the Reattach lists only what is mapped.
  BATON_RETURN_IF_ERROR(SendOrDefer(msg));
  return unmapped;
}

Status EngineSession::Impl::ReportDrained(uint32_t unfinished) {
  {
    MutexLock lock(mu_);
    // One answer per Drain, also for a drain called off (Resume) before it.
    if (drains_unanswered_ == 0) return FailedPrecondition("ReportDrained: no drain pending");
    --drains_unanswered_;
    // A drain called off before this answer (Resume) leaves the engine serving.
    if (drain_ == DrainState::kDraining) drain_ = DrainState::kDrained;
    drained_unfinished_ = unfinished;
  }
  return SendOrDefer(proto::Drained{.epoch = epoch_.load(), .unfinished = unfinished});
}

Status EngineSession::Impl::ReportKvAdoption(const KvAdoptionSummary& summary) {
  if (protocol_.load() < proto::kProtocolVersionKvAdopted) return OkStatus();
  proto::KvAdopted msg{.epoch = epoch_.load(),
                       .adopted = summary.adopted,
                       .tokens = summary.tokens,
                       .micros = static_cast<uint32_t>(std::clamp(summary.ms * 1e3, 0.0, 4e9))};
  for (const auto& [reason, count] : summary.dropped) {
    msg.dropped_reasons.push_back(reason);
    msg.dropped_counts.push_back(count);
  }
  return SendOrDefer(msg);
}

void EngineSession::Impl::SetDrain(DrainState state) {
  MutexLock lock(mu_);
  drain_ = state;
}

Status EngineSession::Impl::ReportError(const Status& error) {
  const Status reported = error.ok() ? Internal("error reported without a status") : error;
  BATON_LOG(ERROR, kLog) << "reporting an error to the controller: " << reported.ToString();
  const proto::ErrorReport report{.epoch = epoch_.load(),
                                  .code = static_cast<uint32_t>(reported.code()),
                                  .message = reported.message()};
  {
    MutexLock lock(mu_);
    if (!failed_.has_value()) failed_ = "reported an error: " + reported.message();
    if (!error_.has_value()) error_ = report;  // the first: sent again after a reattach
  }
  cv_.NotifyAll();
  return Send(report);
}

Status EngineSession::Impl::CheckEpoch() const {
  MutexLock lock(mu_);
  if (disconnected_.has_value())
    return Unavailable("controller connection lost: " + *disconnected_);
  if (stopped_.has_value()) return FailedPrecondition("told to stop: " + *stopped_);
  if (failed_.has_value()) return FailedPrecondition(*failed_);
  return OkStatus();
}

std::optional<DeviceRegionView> EngineSession::Impl::device_weights() const {
  MutexLock lock(mu_);
  if (device_ == nullptr) return std::nullopt;
  return device_->weights();
}

std::optional<DeviceRegionView> EngineSession::Impl::device_pool() const {
  MutexLock lock(mu_);
  if (device_ == nullptr) return std::nullopt;
  return device_->pool();
}

std::vector<MappedExtent> EngineSession::Impl::extents() const {
  MutexLock lock(mu_);
  std::vector<MappedExtent> out;
  for (const auto& [first, count] : pool_.mapped()) out.push_back(ExtentOf(first, count));
  return out;
}

void EngineSession::Impl::Shutdown() {
  if (stopping_.exchange(true)) return;
  if (wake_fd_) {
    const uint64_t one = 1;
    ssize_t unused = ::write(wake_fd_.get(), &one, sizeof(one));
    (void)unused;
  }
  {
    // A reconnect waiting for the controller's answer: its Receive returns at once.
    MutexLock lock(channel_mu_);
    if (handshake_fd_ >= 0) ::shutdown(handshake_fd_, SHUT_RDWR);
  }
  if (thread_.joinable()) thread_.join();
  {
    MutexLock lock(mu_);
    pool_.UnmapAll();
    device_.reset();
    if (!disconnected_.has_value()) disconnected_ = "the session was shut down";
    events_.push_back(SessionEvent{.kind = SessionEventKind::kDisconnected,
                                   .reason = "the session was shut down"});
  }
  cv_.NotifyAll();  // a thread in WaitForPromotion or NextEvent returns
  MutexLock lock(channel_mu_);
  if (channel_.has_value()) channel_->Close();
  channel_.reset();
}

}  // namespace baton
