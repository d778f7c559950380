// Controller: launching engines and handling their messages.
#include <fcntl.h>
#include <signal.h>

#include <algorithm>
#include <charconv>
#include <utility>

#include "base/log.h"
#include "base/text/utf8.h"
#include "controller/controller.h"

namespace baton {
namespace {

constexpr const char* kLog = "controller";

std::string Name(const EngineRecord& e) { return "engine " + std::to_string(e.id); }

}  // namespace

// --- launching --------------------------------------------------------------------------------

std::optional<TimePoint> Controller::NextLaunchAt() const {
  if (stopping_ || LiveEngines() >= 2) return std::nullopt;
  const PairState s = pair_.state();
  if (s == PairState::kStopped || s == PairState::kDraining) return std::nullopt;
  // During a failover the promotion path has the machine to itself; the replacement starts
  // once it is done. At start-up both engines start together.
  if ((promoting_ != kNoEngine || failover_.has_value()) && s != PairState::kStarting) {
    return std::nullopt;
  }
  if (cuda_backend_ && device_ == nullptr) return std::nullopt;  // waits for the device memory
  TimePoint at = guard_.NextRestartAt();
  if (LiveEngines() == 1) at = std::max(at, relaunch_not_before_);  // the new primary first
  return at;
}

void Controller::MaybeLaunch() {
  const std::optional<TimePoint> at = NextLaunchAt();
  if (!at.has_value()) return;
  if (LiveEngines() == 1 && clock_.Now() < relaunch_not_before_) return;  // the new primary first
  if (guard_.InBackoff()) {
    if (!backoff() && pair_.Allows(PairEvent::kCrashLoopTripped)) {
      ApplyPair(PairEvent::kCrashLoopTripped);
      BATON_LOG(WARN, kLog) << "crash loop: " << guard_.recent_failures()
                            << " engine failures in the window; restarts held back for "
                            << MillisBetween(clock_.Now(), guard_.backoff_until()) << " ms";
    }
    return;
  }
  if (backoff()) ApplyPair(PairEvent::kBackoffElapsed);
  if (!guard_.TryStartRestart()) return;
  Launch(primary_ != kNoEngine || LiveEngines() > 0 ? "standby" : "primary");
}

int Controller::PickPort() const {
  if (config_.base_port == 0) return 0;
  for (int k = 0; k < config_.port_count; ++k) {
    const int port = config_.base_port + k;
    bool used = false;
    for (const auto& [id, e] : engines_) used = used || e->port == port;
    if (!used) return port;
  }
  return config_.base_port;
}

void Controller::Launch(const std::string& role) {
  const TimePoint now = clock_.Now();
  const EngineId id = next_engine_id_++;
  Result<std::string> token = Supervisor::NewToken();
  if (!token.ok()) {
    BATON_LOG(ERROR, kLog) << "cannot make a launch token: " << token.status().ToString();
    (void)guard_.RecordFailure();
    return;
  }
  auto rec = std::make_unique<EngineRecord>(id, clock_);
  rec->launch_role = role;
  rec->token = *token;
  rec->port = PickPort();
  rec->launched_at = now;
  rec->deadline = now + config_.register_timeout;
  ++launches_;
  rec->command = CommandFor(id, role);
  Result<std::shared_ptr<EngineCgroup>> cgroup = MakeCgroup(id);
  Result<ChildProcess> child =
      cgroup.ok() ? supervisor_.Launch({.engine_id = id,
                                        .role = role,
                                        .token = *token,
                                        .port = rec->port,
                                        .command = rec->command,
                                        .cgroup_procs_fd = *cgroup ? (*cgroup)->procs_fd() : -1})
                  : Result<ChildProcess>(cgroup.status());
  if (!child.ok()) {
    BATON_LOG(ERROR, kLog) << "engine " << id << " (" << role
                           << ") failed to launch: " << child.status().ToString();
    exits_.push_back(EngineExit{now, id, 0, role, "launch failed", child.status().message()});
    if (exits_.size() > 20) exits_.pop_front();
    (void)guard_.RecordFailure();
    if (IsCanary(id))
      EndUpgrade("rolled_back", "the canary failed to launch: " + child.status().message());
    return;
  }
  rec->cgroup = std::move(cgroup).value();
  rec->process = std::move(child).value();
  BATON_LOG(INFO, kLog) << "launched engine " << id << " as " << role << ": pid "
                        << rec->process.pid() << ", port " << rec->port;
  engines_[id] = std::move(rec);
  WatchPid(id);
  if (PromotionRecord* r = timelines_.awaiting_standby(); r != nullptr && !r->standby_launched) {
    r->standby_launched = now;
  }
}

void Controller::WatchPid(EngineId id) {
  EngineRecord* e = Find(id);
  if (e == nullptr) return;
  const int fd = ::fcntl(e->process.pidfd(), F_DUPFD_CLOEXEC, 0);
  if (fd < 0) {
    BATON_LOG(ERROR, kLog) << "cannot watch engine " << id << ": dup of its pidfd failed";
    return;
  }
  e->pid_watch = std::make_unique<boost::asio::posix::stream_descriptor>(io_, fd);
  e->pid_watch->async_wait(boost::asio::posix::stream_descriptor::wait_read,
                           [this, id](const boost::system::error_code& ec) {
                             if (ec) return;  // the record is gone
                             OnProcessExit(id);
                           });
}

// --- the engine's connection ------------------------------------------------------------------

void Controller::AttachEngine(EngineId id, std::unique_ptr<proto::Channel> channel) {
  EngineRecord* e = Find(id);
  if (e == nullptr) return;
  e->channel = std::move(channel);
  e->channel->set_label("engine " + std::to_string(id));
  e->channel->SetSendBudget(nullptr);  // the clients' budget is not the engines' to spend
  ++e->channel_gen;
  ReadEngine(id);
}

void Controller::ReadEngine(EngineId id) {
  EngineRecord* e = Find(id);
  if (e == nullptr || e->channel == nullptr) return;
  const uint64_t gen = e->channel_gen;
  e->channel->AsyncReceive([this, id, gen](Result<proto::ReceivedMessage> msg) {
    EngineRecord* e = Find(id);
    if (e == nullptr || e->channel == nullptr || e->channel_gen != gen) return;
    if (!msg.ok() && stopping_) {
      // After Stop, the engine closing its connection is its goodbye; its exit is awaited.
      BATON_LOG(DEBUG, kLog) << Name(*e) << " closed its connection: " << msg.status().message();
      e->channel.reset();
    } else if (!msg.ok()) {
      // A clean close is Unavailable; anything else was a protocol error on this connection.
      if (msg.status().code() != StatusCode::kUnavailable) {
        Refused("engine " + std::to_string(id), "protocol error: " + msg.status().message());
      }
      Fail(id, FailCause::kEof, msg.status().message());
    } else {
      OnEngineMessage(id, *msg);
      e = Find(id);
      if (e != nullptr && e->channel != nullptr && e->channel_gen == gen) ReadEngine(id);
    }
    ArmTick();
  });
}

namespace {

// What an engine registers is copied into every route table: bounded, and an address a
// router can dial (HOST:PORT; empty, or port 0, for an engine that serves no HTTP).
constexpr size_t kMaxRegisterString = 256;

Status CheckRegisterFields(const proto::Register& reg) {
  for (const auto& [name, value] :
       {std::pair<const char*, const std::string*>{"engine_version", &reg.engine_version},
        {"http_address", &reg.http_address}}) {
    if (value->size() > kMaxRegisterString) {
      return InvalidArgument(std::string("Register: ") + name + " is " +
                             std::to_string(value->size()) + " bytes; at most " +
                             std::to_string(kMaxRegisterString));
    }
    if (!IsValidUtf8(*value)) {
      return InvalidArgument(std::string("Register: ") + name + " is not valid UTF-8");
    }
  }
  const std::string& a = reg.http_address;
  if (a.empty()) return OkStatus();
  const size_t colon = a.rfind(':');
  unsigned port = 0;
  const char* end = a.data() + a.size();
  const bool port_ok = colon != std::string::npos && colon + 1 < a.size() &&
                       std::from_chars(a.data() + colon + 1, end, port).ptr == end && port <= 65535;
  const bool host_ok = colon != std::string::npos && colon > 0 &&
                       std::none_of(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(colon),
                                    [](unsigned char c) { return c <= ' ' || c == '/'; });
  if (!port_ok || !host_ok) {
    return InvalidArgument("Register: http_address '" + a + "' is not HOST:PORT");
  }
  return OkStatus();
}

// Decodes `msg` as a T; a payload that does not decode closes the connection (protocol error).
template <typename T>
std::optional<T> DecodeOrClose(proto::Channel& channel, const proto::ReceivedMessage& msg,
                               std::string* error) {
  Result<T> decoded = msg.As<T>();
  if (decoded.ok()) return std::move(decoded).value();
  *error = decoded.status().message();
  channel.CloseWithError(decoded.status());
  return std::nullopt;
}

}  // namespace

void Controller::OnEngineMessage(EngineId id, const proto::ReceivedMessage& msg) {
  EngineRecord& e = *Find(id);
  using proto::MsgType;
  std::string error;
  if (!e.registered && msg.type != MsgType::kRegister) {
    RefuseEngine(e, FailedPrecondition("expected Register, got " + proto::MsgTypeName(msg.type)));
    return;
  }
  switch (msg.type) {
    case MsgType::kRegister:
      return OnRegister(e, msg);
    case MsgType::kStandbyReady:
      if (auto m = DecodeOrClose<proto::StandbyReady>(*e.channel, msg, &error)) {
        return OnStandbyReady(e, *m);
      }
      break;
    case MsgType::kHeartbeat:
      if (auto m = DecodeOrClose<proto::Heartbeat>(*e.channel, msg, &error)) {
        return OnHeartbeat(e, *m);
      }
      break;
    case MsgType::kLeaseRequest:
      if (auto m = DecodeOrClose<proto::LeaseRequest>(*e.channel, msg, &error)) {
        return OnLeaseRequest(e, *m);
      }
      break;
    case MsgType::kReturnExtents:
      if (auto m = DecodeOrClose<proto::ReturnExtents>(*e.channel, msg, &error)) {
        return OnReturn(e, *m);
      }
      break;
    case MsgType::kErrorReport:
      if (auto m = DecodeOrClose<proto::ErrorReport>(*e.channel, msg, &error)) {
        return Fail(id, FailCause::kError, m->message);
      }
      break;
    case MsgType::kPromoteAck:
      if (auto m = DecodeOrClose<proto::PromoteAck>(*e.channel, msg, &error)) {
        return OnPromoteAck(e, *m);
      }
      break;
    case MsgType::kDrained:
      if (auto m = DecodeOrClose<proto::Drained>(*e.channel, msg, &error)) {
        return OnDrained(e, *m);
      }
      break;
    case MsgType::kShareMemoryAck:
      if (auto m = DecodeOrClose<proto::ShareMemoryAck>(*e.channel, msg, &error)) {
        return OnShareMemoryAck(e, *m);
      }
      break;
    case MsgType::kErrorMsg:
      if (auto m = DecodeOrClose<proto::ErrorMsg>(*e.channel, msg, &error)) {
        BATON_LOG(WARN, kLog) << Name(e) << " refused a controller message: " << m->message;
        return;
      }
      break;
    default:
      RefuseEngine(
          e, InvalidArgument("unexpected " + proto::MsgTypeName(msg.type) + " from an engine"));
      return;
  }
  Refused(Name(e), "malformed message: " + error);
  Fail(id, FailCause::kEof, "malformed " + proto::MsgTypeName(msg.type) + ": " + error);
}

void Controller::OnRegister(EngineRecord& e, const proto::ReceivedMessage& msg) {
  std::string error;
  std::optional<proto::Register> reg = DecodeOrClose<proto::Register>(*e.channel, msg, &error);
  if (!reg.has_value()) return Fail(e.id, FailCause::kEof, "malformed Register: " + error);
  if (e.registered) return RefuseEngine(e, FailedPrecondition("already registered"));
  if (reg->engine_id != e.id) {
    const std::string why = "Register names engine " + std::to_string(reg->engine_id) +
                            " but its launch token belongs to engine " + std::to_string(e.id);
    Refused(Name(e), why);
    (void)e.channel->Send(proto::Stop{.reason = why});
    return Fail(e.id, FailCause::kMisbehaved, why);
  }
  if (Status fields = CheckRegisterFields(*reg); !fields.ok()) {
    Refused(Name(e), fields.message());
    (void)e.channel->Send(proto::Stop{.reason = fields.message()});
    return Fail(e.id, FailCause::kMisbehaved, fields.message());
  }
  if (Status added = ledger_->AddStandby(e.id); !added.ok()) {
    return Fail(e.id, FailCause::kMisbehaved, added.message());
  }
  e.version = reg->engine_version;
  e.http_address = reg->http_address;
  proto::RegisterAck ack{
      .engine_id = e.id,
      .model = weights_->dir(),
      .arena_size = weights_->arena().size(),
      .arena_huge_pages = weights_->arena().huge_pages(),
      .tensors = {},
      .block_count = config_.block_count,
      .block_bytes = config_.block_bytes,
      .pool_huge_pages = pool_.huge_pages(),
      .reserve_bytes = uint64_t{config_.block_count} * config_.block_bytes,
      .heartbeat_interval_ms = static_cast<uint32_t>(
          std::chrono::duration_cast<std::chrono::milliseconds>(config_.heartbeat_interval)
              .count()),
      .device = device_ != nullptr ? device_->device() : -1,
      .device_regions = device_ != nullptr ? kDeviceRegionCount : 0};
  for (const CachedTensor& t : weights_->tensors()) {
    ack.tensors.push_back(
        proto::TensorEntry{t.name, static_cast<uint8_t>(t.dtype), t.shape, t.offset, t.size});
  }
  Result<UniqueFd> arena_fd = weights_->arena().memory().Dup();
  Result<UniqueFd> pool_fd = pool_.Dup();
  Status sent = !arena_fd.ok() ? arena_fd.status()
                : !pool_fd.ok()
                    ? pool_fd.status()
                    : e.channel->Send(ack, std::vector<int>{arena_fd->get(), pool_fd->get()});
  if (!sent.ok()) return Fail(e.id, FailCause::kEof, "sending RegisterAck: " + sent.message());
  if (device_ != nullptr) {
    if (Status shared = device_->Share(*e.channel); !shared.ok()) {
      return Fail(e.id, FailCause::kEof, "sending the device regions: " + shared.message());
    }
  }
  e.registered = true;
  FailureDetector::Options options{.heartbeat_interval = config_.heartbeat_interval,
                                   .misses = config_.heartbeat_misses,
                                   .probe_timeout = config_.probe_timeout};
  e.detector.emplace(clock_, options);
  e.last_heartbeat = clock_.Now();
  BATON_LOG(INFO, kLog) << Name(e) << " (pid " << e.process.pid() << ") registered: version "
                        << e.version << ", http " << e.http_address;
}

void Controller::OnShareMemoryAck(EngineRecord& e, const proto::ShareMemoryAck& msg) {
  if (device_ == nullptr || !e.is(EngineState::kLaunching)) {
    return RefuseEngine(e, FailedPrecondition("ShareMemoryAck for '" + msg.name +
                                              "' without device regions being offered"));
  }
  if (msg.mapped) {
    BATON_LOG(INFO, kLog) << Name(e) << " took device region '" << msg.name << "'";
    if (e.device_memory.empty()) e.device_memory = "mapped";
    return;
  }
  BATON_LOG(WARN, kLog) << Name(e) << " declined device region '" << msg.name << "': " << msg.detail
                        << "; it uses the host arena and pool";
  e.device_memory = msg.detail;
}

void Controller::OnStandbyReady(EngineRecord& e, const proto::StandbyReady& msg) {
  if (!e.is(EngineState::kLaunching)) {
    return RefuseEngine(
        e, FailedPrecondition(std::string("StandbyReady in state ") + ToString(e.machine.state())));
  }
  (void)e.machine.Apply(EngineEvent::kRegistered);
  e.ready_at = clock_.Now();
  e.deadline.reset();
  e.prefault_us = msg.prefault_us;
  BATON_LOG(INFO, kLog) << Name(e) << " is a half-started standby: " << msg.arena_mapped_bytes
                        << " weight bytes mapped read-only (pre-faulted in "
                        << msg.prefault_us / 1000.0 << " ms), " << msg.reserved_bytes
                        << " bytes of pool range reserved";
  CheckNvmlSeesEngine(e);
  if (pair_.Allows(PairEvent::kStandbyReady)) ApplyPair(PairEvent::kStandbyReady);
  if (PromotionRecord* r = timelines_.awaiting_standby(); r != nullptr) {
    r->standby_ready = clock_.Now();
  }
  MaybePromote();
  if (IsCanary(e.id) && Find(primary_) != nullptr && Find(primary_)->serving) StartCanary(e);
  PublishRoutes();
  MaybeLaunch();
}

// The barrier's GPU half asks NVML whether a reaped engine's pids are still on the GPU. An
// engine that mapped device memory has a context, so NVML must list it now; if it does not
// (the controller in another PID namespace than the pids NVML reports, a container without
// --pid=host), that half cannot see anything: said once, loudly, and in `status`.
void Controller::CheckNvmlSeesEngine(const EngineRecord& e) {
  if (nvml_ == nullptr || device_ == nullptr || e.device_memory != "mapped") return;
  if (nvml_lists_engines_.value_or(false)) return;
  const bool listed = GpuStillLists(EnginePids(e));
  if (listed) {
    BATON_LOG(INFO, kLog) << "barrier: NVML lists " << Name(e) << "'s process on GPU "
                          << device_->pci_bus_id() << ": the barrier waits for its release";
  } else if (!nvml_lists_engines_.has_value()) {
    BATON_LOG(ERROR, kLog) << "barrier: NVML does not list " << Name(e) << " (pid "
                           << e.process.pid() << ") on GPU " << device_->pci_bus_id()
                           << " although it mapped device memory; the controller may run in "
                              "another PID namespace than NVML reports (a container without "
                              "--pid=host): blocks move on at the reap, without the driver's "
                              "release";
  }
  nvml_lists_engines_ = listed;
}

bool Controller::CheckEpoch(EngineRecord& e, uint64_t epoch, const char* what) {
  // A heartbeat sent before the engine saw its Promote still carries the standby's 0.
  if (epoch == 0 && e.is(EngineState::kPromoting)) return true;
  Status ok = ledger_->CheckMessage(e.id, epoch);
  if (ok.ok()) return true;
  const std::string why = std::string(what) + " refused: " + ok.message();
  Refused(Name(e), why);
  (void)e.channel->Send(proto::ErrorMsg::FromStatus(FailedPrecondition(why)));
  (void)e.channel->Send(proto::Stop{.reason = why});
  Fail(e.id, FailCause::kStale, why);
  return false;
}

void Controller::OnHeartbeat(EngineRecord& e, const proto::Heartbeat& msg) {
  if (!CheckEpoch(e, msg.epoch, "Heartbeat")) return;
  if (e.detector.has_value()) e.detector->OnHeartbeat();
  ++e.heartbeats;
  e.last_heartbeat = clock_.Now();
}

void Controller::OnLeaseRequest(EngineRecord& e, const proto::LeaseRequest& msg) {
  if (!CheckEpoch(e, msg.epoch, "LeaseRequest")) return;
  Result<std::vector<Extent>> granted = ledger_->Grant(e.id, msg.blocks, msg.epoch);
  if (!granted.ok()) return RefuseEngine(e, granted.status());
  Status sent = e.channel->Send(proto::Grant{.epoch = msg.epoch, .extents = ToRanges(*granted)});
  BATON_LOG(INFO, kLog) << "granted " << msg.blocks << " blocks to " << Name(e) << " at epoch "
                        << msg.epoch;
  if (!sent.ok()) Fail(e.id, FailCause::kEof, "sending Grant: " + sent.message());
  CheckInvariants();
}

void Controller::OnReturn(EngineRecord& e, const proto::ReturnExtents& msg) {
  if (!CheckEpoch(e, msg.epoch, "ReturnExtents")) return;
  for (const proto::BlockRange& r : msg.extents) {
    Status returned = ledger_->Return(e.id, Extent{r.first, r.count}, msg.epoch);
    if (!returned.ok()) return RefuseEngine(e, returned);
  }
  BATON_LOG(INFO, kLog) << Name(e) << " returned " << msg.extents.size() << " extents";
  CheckInvariants();
  if (e.id == primary_) OnPrimaryReturned();
}

void Controller::RefuseEngine(EngineRecord& e, const Status& status) {
  Refused(Name(e), status.message());
  if (e.channel == nullptr) return;
  // An engine that took nothing for send_timeout, or fell too far behind, cannot be sent
  // this: it is fenced, as for any other message it cannot be sent.
  Status sent = e.channel->Send(proto::ErrorMsg::FromStatus(status));
  if (!sent.ok()) Fail(e.id, FailCause::kEof, "sending ErrorMsg: " + sent.message());
}

// --- lookups ------------------------------------------------------------------------------------

EngineRecord* Controller::Find(EngineId id) {
  auto it = engines_.find(id);
  return it == engines_.end() ? nullptr : it->second.get();
}

EngineRecord* Controller::FindByToken(const std::string& token) {
  if (token.empty()) return nullptr;
  for (auto& [id, e] : engines_) {
    if (e->token == token) return e.get();
  }
  return nullptr;
}

EngineRecord* Controller::Standby() {
  for (auto& [id, e] : engines_) {
    if (e->live() && e->is(EngineState::kStandby)) return e.get();
  }
  return nullptr;
}

size_t Controller::LiveEngines() const {
  size_t n = 0;
  for (const auto& [id, e] : engines_) n += e->live() ? 1 : 0;
  return n;
}

}  // namespace baton
