// EngineSession::Impl: the heartbeat thread's outer loop, and the reconnect after the
// controller went away (see engine_session_impl.h and step 5 of engine_sdk.h).
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>

#include "base/log.h"
#include "proto/hello.h"
#include "proto/transport/listener.h"
#include "standby/sdk/engine_session_impl.h"

namespace baton {
namespace {

constexpr const char* kLog = "engine-sdk";

std::string MillisText(Duration d) {
  return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count()) + " ms";
}

// The blocks of `reported` that `pool` no longer maps, as runs.
std::vector<proto::BlockRange> NoLongerMapped(const std::vector<proto::BlockRange>& reported,
                                              const PoolMapping& pool) {
  std::vector<proto::BlockRange> gone;
  for (const proto::BlockRange& r : reported) {
    for (uint32_t b = r.first; b < r.first + r.count; ++b) {
      if (pool.IsMapped(b)) continue;
      if (!gone.empty() && gone.back().first + gone.back().count == b) {
        ++gone.back().count;
      } else {
        gone.push_back(proto::BlockRange{.first = b, .count = 1});
      }
    }
  }
  return gone;
}

}  // namespace

// Registers the socket of a reconnect in progress, so that Shutdown() can shut it down (a
// Receive waiting on it returns at once), for as long as it is in scope. Declare it after the
// channel it watches: it must let go of the fd number before the socket is closed.
class EngineSession::Impl::HandshakeWatch {
 public:
  HandshakeWatch(Impl* impl, int fd) : impl_(impl) {
    MutexLock lock(impl_->channel_mu_);
    impl_->handshake_fd_ = fd;
    // Shutdown() sets stopping_ before it looks at handshake_fd_: one of them sees the other.
    if (impl_->stopping_.load()) ::shutdown(fd, SHUT_RDWR);
  }
  ~HandshakeWatch() {
    MutexLock lock(impl_->channel_mu_);
    impl_->handshake_fd_ = -1;
  }
  HandshakeWatch(const HandshakeWatch&) = delete;
  HandshakeWatch& operator=(const HandshakeWatch&) = delete;

 private:
  Impl* impl_;
};

void EngineSession::Impl::Run() {
  while (true) {
    const Status lost = ServeAttached();
    if (lost.ok() || stopping_.load()) return;  // shut down
    if (!CanReattach()) {
      OnDisconnected(lost.message());
      return;
    }
    // Taken before kControllerLost is pushed: whoever sees the event sees the absence begun.
    const TimePoint lost_at = clock_->Now();
    OnControllerLost(lost.message());
    if (!AwaitController(lost_at)) return;
  }
}

bool EngineSession::Impl::CanReattach() const {
  // Reattach is protocol 5; a session without handles_resume speaks 2.
  if (!registered_.load() || !options_.handles_resume || stopping_.load()) return false;
  MutexLock lock(mu_);
  return !stopped_.has_value() && !disconnected_.has_value();
}

bool EngineSession::Impl::ConnectionGone() {
  MutexLock lock(channel_mu_);
  return !channel_.has_value() || !channel_->is_open();
}

proto::ReattachRole EngineSession::Impl::RoleLocked() const {
  if (drain_ == DrainState::kDrained) return proto::ReattachRole::kDrained;
  if (drain_ == DrainState::kDraining) return proto::ReattachRole::kDraining;
  if (serving_) return proto::ReattachRole::kServing;
  if (promoted_) return proto::ReattachRole::kPromoted;
  return proto::ReattachRole::kStandby;
}

void EngineSession::Impl::SetControllerAbsence(Duration timeout, ControllerAbsentAction action) {
  absent_timeout_ns_.store(std::max(timeout, Duration::zero()).count());
  absent_action_.store(action);
}

void EngineSession::Impl::OnControllerLost(const std::string& reason) {
  BATON_LOG(WARN, kLog) << "lost the controller (" << reason << "): keeping epoch " << epoch_.load()
                        << " and its blocks, reconnecting to " << options_.launch.socket_path;
  {
    MutexLock lock(channel_mu_);
    if (channel_.has_value()) channel_->Close();
    channel_.reset();
  }
  Push(SessionEvent{
      .kind = SessionEventKind::kControllerLost, .epoch = epoch_.load(), .reason = reason});
}

bool EngineSession::Impl::AwaitController(TimePoint lost_at) {
  Duration backoff =
      std::max<Duration>(options_.reconnect_backoff_initial, std::chrono::milliseconds(1));
  bool logged = false;
  for (uint64_t attempt = 1; !stopping_.load(); ++attempt) {
    if (GiveUpAfterAbsence(lost_at, &logged)) return false;
    const Attempt tried = TryReattach();
    switch (tried.outcome) {
      case AttemptOutcome::kAttached:
        BATON_LOG(INFO, kLog) << tried.reason << " after " << MillisBetween(lost_at, clock_->Now())
                              << " ms away (" << attempt << " attempts)";
        Push(SessionEvent{.kind = SessionEventKind::kControllerBack,
                          .epoch = epoch_.load(),
                          .reason = tried.reason});
        return true;
      case AttemptOutcome::kRefused:
        OnStop(tried.reason);
        return false;
      case AttemptOutcome::kFailed:
        BATON_LOG(DEBUG, kLog) << "reconnect attempt " << attempt << ": " << tried.reason;
        break;
    }
    if (!WaitBackoff(backoff)) return false;
    backoff = std::min(backoff * 2, std::max(backoff, options_.reconnect_backoff_max));
  }
  return false;
}

bool EngineSession::Impl::GiveUpAfterAbsence(TimePoint lost_at, bool* logged) {
  const Duration timeout(absent_timeout_ns_.load());
  if (timeout <= Duration::zero() || clock_->Now() - lost_at < timeout) return false;
  const std::string waited = "no controller came back within " + MillisText(timeout);
  if (absent_action_.load() == ControllerAbsentAction::kStop) {
    OnDisconnected(waited + " (on_controller_absent: stop)");
    return true;
  }
  if (!*logged) {
    BATON_LOG(WARN, kLog) << waited << " (on_controller_absent: serve): serving on, reconnecting";
    *logged = true;
  }
  return false;
}

bool EngineSession::Impl::WaitBackoff(Duration d) {
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(d).count();
  pollfd wake{.fd = wake_fd_.get(), .events = POLLIN, .revents = 0};
  (void)::poll(&wake, 1, static_cast<int>(std::clamp<int64_t>(ms, 1, 60'000)));
  return !stopping_.load();
}

EngineSession::Impl::Attempt EngineSession::Impl::TryReattach() {
  Result<proto::Channel> channel =
      proto::Connect(io_, options_.launch.socket_path, ChannelOptionsForController());
  if (!channel.ok()) return Attempt{AttemptOutcome::kFailed, channel.status().message()};
  HandshakeWatch watch(this, channel->native_handle());
  Reported reported;
  proto::ReattachAck ack;
  const Attempt said = SayReattach(*channel, &reported, &ack);
  if (said.outcome != AttemptOutcome::kAttached) return said;
  heartbeat_interval_ = std::chrono::milliseconds(ack.heartbeat_interval_ms);
  beat_every_ns_.store(std::chrono::duration_cast<Duration>(heartbeat_interval_).count());
  {
    MutexLock lock(channel_mu_);
    if (stopping_.load()) return Attempt{AttemptOutcome::kFailed, "the session is shut down"};
    channel_.emplace(std::move(channel).value());
  }
  CatchUp(reported);
  return Attempt{AttemptOutcome::kAttached, std::string("reattached to the controller as ") +
                                                proto::ToString(reported.role) + " at epoch " +
                                                std::to_string(epoch_.load())};
}

EngineSession::Impl::Attempt EngineSession::Impl::SayReattach(proto::Channel& channel,
                                                              Reported* reported,
                                                              proto::ReattachAck* ack) {
  // Protocol 5 or nothing: a controller too old to take a Reattach refuses the Hello.
  const proto::ClientHelloOptions hello{.peer_name = options_.peer_name,
                                        .role = proto::PeerRole::kEngine,
                                        .launch_token = options_.launch.launch_token,
                                        .min_version = proto::kProtocolVersionReattach,
                                        .max_version = proto::kProtocolVersionMax,
                                        .timeout = options_.connect_timeout};
  if (Result<proto::HelloAck> said = proto::ClientHello(channel, hello); !said.ok()) {
    // FailedPrecondition: a HelloReject (a token this controller does not know, no common
    // version) or an answer that is no HelloAck. Anything else is the connection failing.
    const bool refused = said.status().code() == StatusCode::kFailedPrecondition;
    return Attempt{refused ? AttemptOutcome::kRefused : AttemptOutcome::kFailed,
                   said.status().message()};
  } else {
    protocol_.store(said->version);
  }
  const proto::Reattach msg = ReattachMessage(reported);
  if (Status sent = channel.Send(msg, LivenessFds()); !sent.ok()) {
    return Attempt{AttemptOutcome::kFailed, sent.message()};
  }
  return ReadReattachAnswer(channel, ack);
}

proto::Reattach EngineSession::Impl::ReattachMessage(Reported* reported) const {
  {
    MutexLock lock(mu_);
    reported->role = RoleLocked();
    for (const auto& [first, count] : pool_.mapped()) {
      reported->extents.push_back(proto::BlockRange{.first = first, .count = count});
    }
  }
  return proto::Reattach{.engine_id = options_.launch.engine_id,
                         .engine_version = options_.engine_version,
                         .http_address = options_.http_address,
                         .role = static_cast<uint8_t>(reported->role),
                         .epoch = epoch_.load(),
                         .extents = reported->extents,
                         .arena_dev = arena_id_.dev,
                         .arena_ino = arena_id_.ino,
                         .pool_dev = pool_id_.dev,
                         .pool_ino = pool_id_.ino};
}

EngineSession::Impl::Attempt EngineSession::Impl::ReadReattachAnswer(proto::Channel& channel,
                                                                     proto::ReattachAck* ack) {
  Result<proto::ReceivedMessage> reply = channel.Receive(options_.connect_timeout);
  if (!reply.ok()) return Attempt{AttemptOutcome::kFailed, reply.status().message()};
  if (reply->type == proto::MsgType::kStop) {
    Result<proto::Stop> stop = reply->As<proto::Stop>();
    return Attempt{AttemptOutcome::kRefused,
                   "the controller refused the reattach: " +
                       (stop.ok() ? stop->reason : stop.status().message())};
  }
  Result<proto::ReattachAck> got = reply->As<proto::ReattachAck>();
  if (!got.ok()) return Attempt{AttemptOutcome::kFailed, got.status().message()};
  if (got->engine_id != options_.launch.engine_id) {
    return Attempt{AttemptOutcome::kRefused,
                   "ReattachAck names engine " + std::to_string(got->engine_id) +
                       ", this is engine " + std::to_string(options_.launch.engine_id)};
  }
  if (got->heartbeat_interval_ms == 0) {
    return Attempt{AttemptOutcome::kFailed, "ReattachAck: heartbeat interval 0"};
  }
  *ack = *got;
  return Attempt{AttemptOutcome::kAttached, ""};
}

void EngineSession::Impl::CatchUp(const Reported& reported) {
  std::vector<proto::BlockRange> returned;
  proto::ReattachRole role;
  uint32_t unfinished = 0;
  uint32_t blocks = 0;
  std::optional<proto::ErrorReport> error;
  {
    MutexLock lock(mu_);
    returned = NoLongerMapped(reported.extents, pool_);
    role = RoleLocked();
    unfinished = drained_unfinished_;
    blocks = pool_.mapped_blocks();
    error = error_;
  }
  const uint64_t epoch = epoch_.load();
  std::vector<Status> sent;
  // Returned between the Reattach and now: the controller re-adopted them with this engine.
  if (!returned.empty())
    sent.push_back(Send(proto::ReturnExtents{.epoch = epoch, .extents = returned}));
  if (reported.role == proto::ReattachRole::kPromoted && role != reported.role) {
    sent.push_back(Send(proto::PromoteAck{.epoch = epoch, .blocks_mapped = blocks}));
  }
  if (reported.role == proto::ReattachRole::kDraining && role == proto::ReattachRole::kDrained) {
    sent.push_back(Send(proto::Drained{.epoch = epoch, .unfinished = unfinished}));
  }
  // The new controller has not heard of it; it fences this engine at once.
  if (error.has_value()) sent.push_back(Send(*error));
  for (const Status& s : sent) {
    if (!s.ok()) BATON_LOG(DEBUG, kLog) << "after the reattach: " << s.ToString();
  }
}

}  // namespace baton
