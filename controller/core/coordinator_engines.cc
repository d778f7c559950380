// Coordinator: launching engines and handling their messages.
#include <algorithm>
#include <charconv>
#include <utility>

#include "base/failpoint.h"
#include "base/log.h"
#include "base/text/utf8.h"
#include "controller/core/coordinator.h"

namespace baton {
namespace {

constexpr const char* kLog = "controller";

std::string Name(const EngineRecord& e) { return "engine " + std::to_string(e.id); }

// What an engine registers is copied into every route table: bounded, and an address a
// router can dial (HOST:PORT; empty, or port 0, for an engine that serves no HTTP).
constexpr size_t kMaxRegisterString = 256;

Status CheckRegisterFields(const std::string& version, const std::string& address,
                           const char* message) {
  for (const auto& [name, value] :
       {std::pair<const char*, const std::string*>{"engine_version", &version},
        {"http_address", &address}}) {
    if (value->size() > kMaxRegisterString) {
      return InvalidArgument(std::string(message) + ": " + name + " is " +
                             std::to_string(value->size()) + " bytes; at most " +
                             std::to_string(kMaxRegisterString));
    }
    if (!IsValidUtf8(*value)) {
      return InvalidArgument(std::string(message) + ": " + name + " is not valid UTF-8");
    }
  }
  const std::string& a = address;
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
    return InvalidArgument(std::string(message) + ": http_address '" + a + "' is not HOST:PORT");
  }
  return OkStatus();
}

}  // namespace

Status CheckEngineFields(const std::string& version, const std::string& address,
                         const char* message) {
  return CheckRegisterFields(version, address, message);
}

// --- launching --------------------------------------------------------------------------------

std::optional<TimePoint> Coordinator::NextLaunchAt() const {
  if (stopping_ || LiveEngines() >= 2 || recovery_.has_value()) return std::nullopt;
  const PairState s = pair_.state();
  if (s == PairState::kStopped || s == PairState::kDraining) return std::nullopt;
  // During a failover the promotion path has the machine to itself; the replacement starts
  // once it is done. At start-up both engines start together.
  if ((promoting_ != kNoEngine || failover_.has_value()) && s != PairState::kStarting) {
    return std::nullopt;
  }
  if (cuda_backend_ && !effects_.DeviceMemoryPresent()) return std::nullopt;
  TimePoint at = guard_.NextRestartAt();
  if (LiveEngines() == 1) at = std::max(at, relaunch_not_before_);  // the new primary first
  return at;
}

void Coordinator::MaybeLaunch() {
  const std::optional<TimePoint> at = NextLaunchAt();
  if (!at.has_value()) return;
  if (LiveEngines() == 1 && clock_.Now() < relaunch_not_before_) return;
  if (guard_.InBackoff()) {
    if (!backoff() && pair_.Allows(PairEvent::kCrashLoopTripped)) {
      StepPair(PairEvent::kCrashLoopTripped);
      BATON_LOG(WARN, kLog) << "crash loop: " << guard_.recent_failures()
                            << " engine failures in the window; restarts held back for "
                            << MillisBetween(clock_.Now(), guard_.backoff_until()) << " ms";
    }
    return;
  }
  if (backoff()) StepPair(PairEvent::kBackoffElapsed);
  if (!guard_.TryStartRestart()) return;
  Launch(primary_ != kNoEngine || LiveEngines() > 0 ? proto::LaunchRole::kStandby
                                                    : proto::LaunchRole::kPrimary);
}

int Coordinator::PickPort() const {
  if (config_.base_port == 0) return 0;
  for (int k = 0; k < config_.port_count; ++k) {
    const int port = config_.base_port + k;
    bool used = false;
    for (const auto& [id, e] : engines_) used = used || e->port == port;
    if (!used) return port;
  }
  return config_.base_port;
}

void Coordinator::Launch(proto::LaunchRole role) {
  const TimePoint now = clock_.Now();
  const EngineId id = next_engine_id_++;
  Result<std::string> token = effects_.NewToken();
  if (!token.ok()) {
    BATON_LOG(ERROR, kLog) << "cannot make a launch token: " << token.status().ToString();
    (void)guard_.RecordFailure();
    return;
  }
  auto rec = std::make_unique<EngineRecord>(id, clock_, /*adopted_from_previous=*/false);
  rec->launch_role = role;
  rec->token = *token;
  rec->port = PickPort();
  rec->launched_at = now;
  rec->deadline = now + config_.register_timeout;
  rec->command = CommandFor(id, role);
  ++launches_;
  EngineRecord& e = *rec;
  engines_[id] = std::move(rec);
  Result<pid_t> pid = effects_.Launch(
      LaunchSpec{.id = id, .role = role, .token = e.token, .port = e.port, .command = e.command});
  if (!pid.ok()) {
    BATON_LOG(ERROR, kLog) << "engine " << id << " (" << proto::ToString(role)
                           << ") failed to launch: " << pid.status().ToString();
    RecordExit(e, "launch failed", pid.status().message());
    engines_.erase(id);
    effects_.Release(id);
    (void)guard_.RecordFailure();
    if (IsCanary(id))
      EndUpgrade(UpgradeOutcome::kRolledBack,
                 "the canary failed to launch: " + pid.status().message());
    return;
  }
  e.pid = *pid;
  BATON_FAILPOINT("after_launch");  // a running engine the roster does not list yet
  // Written before the engine can say Hello: a controller restarted from here on knows
  // its token.
  SaveRoster();
  BATON_LOG(INFO, kLog) << "launched engine " << id << " as " << proto::ToString(role) << ": pid "
                        << e.pid << ", port " << e.port;
  if (PromotionRecord* r = timelines_.awaiting_standby(); r != nullptr && !r->standby_launched) {
    r->standby_launched = now;
  }
}

// --- engine messages ------------------------------------------------------------------------

void Coordinator::StopAndFence(EngineRecord& e, FailCause cause, const std::string& why) {
  Refused(Name(e), why);
  (void)effects_.Send(e.id, proto::Stop{.reason = why});
  Fail(e.id, cause, why);
}

void Coordinator::StartDetector(EngineRecord& e) {
  FailureDetector::Options options{.heartbeat_interval = config_.heartbeat_interval,
                                   .misses = config_.heartbeat_misses,
                                   .probe_timeout = config_.probe_timeout};
  e.detector.emplace(clock_, options);
  e.last_heartbeat = clock_.Now();
}

void Coordinator::OnRegister(EngineRecord& e, const proto::Register& reg) {
  if (e.registered()) return RefuseEngine(e, FailedPrecondition("already registered"));
  if (e.adopted) {
    // Launched by the previous controller but never registered with it: it holds nothing
    // and registers as any new engine. Anything else must reattach.
    const RosterEngine* r = recovery_.has_value() ? recovery_->roster.Find(e.id) : nullptr;
    if (!e.is(EngineState::kAdopting) || r == nullptr || r->role != RosterRole::kLaunching) {
      return StopAndFence(e, FailCause::kUnaccounted,
                          "Register from an engine of the previous controller that had "
                          "registered already (it must reattach)");
    }
    recovery_->awaited.erase(e.id);
    recovery_->status.readopted.push_back(e.id);
  }
  if (reg.engine_id != e.id) {
    return StopAndFence(e, FailCause::kMisbehaved,
                        "Register names engine " + std::to_string(reg.engine_id) +
                            " but its launch token belongs to engine " + std::to_string(e.id));
  }
  if (Status fields = CheckRegisterFields(reg.engine_version, reg.http_address, "Register");
      !fields.ok()) {
    return StopAndFence(e, FailCause::kMisbehaved, fields.message());
  }
  if (Status added = ledger_->AddStandby(e.id); !added.ok()) {
    return Fail(e.id, FailCause::kMisbehaved, added.message());
  }
  e.version = reg.engine_version;
  e.http_address = reg.http_address;
  if (!SendOrFail(e, SendRegisterAck{})) return;
  Step(e.machine, EngineEvent::kRegisterAccepted);
  StartDetector(e);
  SaveRoster();  // its address and version, for a controller restarted from here on
  BATON_LOG(INFO, kLog) << Name(e) << " (pid " << e.pid << ") registered: version " << e.version
                        << ", http " << e.http_address;
  if (recovery_.has_value()) TickRecovery();
}

void Coordinator::OnShareMemoryAck(EngineRecord& e, const proto::ShareMemoryAck& msg) {
  if (!cuda_backend_ || !effects_.DeviceMemoryPresent() || !e.is(EngineState::kRegistering)) {
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

void Coordinator::OnStandbyReady(EngineRecord& e, const proto::StandbyReady& msg) {
  if (!e.is(EngineState::kRegistering)) {
    return RefuseEngine(
        e, FailedPrecondition(std::string("StandbyReady in state ") + ToString(e.state())));
  }
  Step(e.machine, EngineEvent::kRegistered);
  e.ready_at = clock_.Now();
  e.deadline.reset();
  e.prefault_us = msg.prefault_us;
  BATON_LOG(INFO, kLog) << Name(e) << " is a half-started standby: " << msg.arena_mapped_bytes
                        << " weight bytes mapped read-only (pre-faulted in "
                        << msg.prefault_us / 1000.0 << " ms), " << msg.reserved_bytes
                        << " bytes of pool range reserved";
  SaveRoster();
  StepPairIfAllowed(PairEvent::kStandbyReady);
  if (PromotionRecord* r = timelines_.awaiting_standby(); r != nullptr) {
    r->standby_ready = clock_.Now();
  }
  MaybePromote();
  const EngineRecord* p = Find(primary_);
  if (IsCanary(e.id) && p != nullptr && p->serving()) StartCanary(e);
  PublishRoutes();
  MaybeLaunch();
}

bool Coordinator::CheckEpoch(EngineRecord& e, uint64_t epoch, const char* what) {
  // A heartbeat sent before the engine saw its Promote still carries the standby's 0.
  if (epoch == 0 && e.is(EngineState::kPromoting)) return true;
  Status ok = ledger_->CheckMessage(e.id, epoch);
  if (ok.ok()) return true;
  const std::string why = std::string(what) + " refused: " + ok.message();
  Refused(Name(e), why);
  (void)effects_.Send(e.id, proto::ErrorMsg::FromStatus(FailedPrecondition(why)));
  (void)effects_.Send(e.id, proto::Stop{.reason = why});
  Fail(e.id, FailCause::kStale, why);
  return false;
}

void Coordinator::OnHeartbeat(EngineRecord& e, const proto::Heartbeat& msg) {
  if (!CheckEpoch(e, msg.epoch, "Heartbeat")) return;
  if (e.detector.has_value()) e.detector->OnHeartbeat();
  ++e.heartbeats;
  e.last_heartbeat = clock_.Now();
}

void Coordinator::OnLeaseRequest(EngineRecord& e, const proto::LeaseRequest& msg) {
  if (!CheckEpoch(e, msg.epoch, "LeaseRequest")) return;
  Result<std::vector<Extent>> granted = ledger_->Grant(e.id, msg.blocks, msg.epoch);
  if (!granted.ok()) return RefuseEngine(e, granted.status());
  SaveRoster();                    // before the engine can map them
  BATON_FAILPOINT("after_grant");  // granted and in the roster, not sent
  BATON_LOG(INFO, kLog) << "granted " << msg.blocks << " blocks to " << Name(e) << " at epoch "
                        << msg.epoch;
  SendOrFail(e, proto::Grant{.epoch = msg.epoch, .extents = ToRanges(*granted)});
}

void Coordinator::OnReturn(EngineRecord& e, const proto::ReturnExtents& msg) {
  if (!CheckEpoch(e, msg.epoch, "ReturnExtents")) return;
  for (const proto::BlockRange& r : msg.extents) {
    Status returned = ledger_->Return(e.id, Extent{r.first, r.count}, msg.epoch);
    if (!returned.ok()) return RefuseEngine(e, returned);
  }
  BATON_LOG(INFO, kLog) << Name(e) << " returned " << msg.extents.size() << " extents";
  if (e.id == primary_) OnPrimaryReturned();
  SaveRoster();
}

void Coordinator::RefuseEngine(EngineRecord& e, const Status& status) {
  Refused(Name(e), status.message());
  if (!e.connected) return;
  // An engine that took nothing for send_timeout, or fell too far behind, cannot be sent
  // this: it is fenced, as for any other message it cannot be sent.
  SendOrFail(e, proto::ErrorMsg::FromStatus(status));
}

}  // namespace baton
