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
  if (s_.stopping || s_.LiveEngines() >= 2 || recovery_.has_value()) return std::nullopt;
  const PairState s = s_.pair.state();
  if (s == PairState::kStopped || s == PairState::kDraining) return std::nullopt;
  // During a failover the promotion path has the machine to itself; the replacement starts
  // once it is done. At start-up both engines start together.
  if ((s_.promoting != kNoEngine || failover_.has_value()) && s != PairState::kStarting) {
    return std::nullopt;
  }
  if (s_.cuda_backend && !s_.effects.DeviceMemoryPresent()) return std::nullopt;
  TimePoint at = s_.guard.NextRestartAt();
  if (s_.LiveEngines() == 1) at = std::max(at, s_.relaunch_not_before);  // the new primary first
  return at;
}

void Coordinator::MaybeLaunch() {
  const std::optional<TimePoint> at = NextLaunchAt();
  if (!at.has_value()) return;
  if (s_.LiveEngines() == 1 && s_.clock.Now() < s_.relaunch_not_before) return;
  if (s_.guard.InBackoff()) {
    if (!s_.backoff() && s_.pair.Allows(PairEvent::kCrashLoopTripped)) {
      s_.StepPair(PairEvent::kCrashLoopTripped);
      BATON_LOG(WARN, kLog) << "crash loop: " << s_.guard.recent_failures()
                            << " engine failures in the window; restarts held back for "
                            << MillisBetween(s_.clock.Now(), s_.guard.backoff_until()) << " ms";
    }
    return;
  }
  if (s_.backoff()) s_.StepPair(PairEvent::kBackoffElapsed);
  if (!s_.guard.TryStartRestart()) return;
  Launch(s_.primary != kNoEngine || s_.LiveEngines() > 0 ? proto::LaunchRole::kStandby
                                                         : proto::LaunchRole::kPrimary);
}

int Coordinator::PickPort() const {
  if (s_.config.base_port == 0) return 0;
  for (int k = 0; k < s_.config.port_count; ++k) {
    const int port = s_.config.base_port + k;
    bool used = false;
    for (const auto& [id, e] : s_.engines) used = used || e->port == port;
    if (!used) return port;
  }
  return s_.config.base_port;
}

void Coordinator::Launch(proto::LaunchRole role) {
  const TimePoint now = s_.clock.Now();
  const EngineId id = s_.next_engine_id++;
  Result<std::string> token = s_.effects.NewToken();
  if (!token.ok()) {
    BATON_LOG(ERROR, kLog) << "cannot make a launch token: " << token.status().ToString();
    (void)s_.guard.RecordFailure();
    return;
  }
  auto rec = std::make_unique<EngineRecord>(id, s_.clock, /*adopted_from_previous=*/false);
  rec->launch_role = role;
  rec->token = *token;
  rec->port = PickPort();
  rec->launched_at = now;
  rec->deadline = now + s_.config.register_timeout;
  rec->command = CommandFor(id, role);
  ++s_.launches;
  EngineRecord& e = *rec;
  s_.engines[id] = std::move(rec);
  Result<pid_t> pid = s_.effects.Launch(
      LaunchSpec{.id = id, .role = role, .token = e.token, .port = e.port, .command = e.command});
  if (!pid.ok()) {
    BATON_LOG(ERROR, kLog) << "engine " << id << " (" << proto::ToString(role)
                           << ") failed to launch: " << pid.status().ToString();
    s_.RecordExit(e, "launch failed", pid.status().message());
    s_.engines.erase(id);
    s_.effects.Release(id);
    (void)s_.guard.RecordFailure();
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
  if (PromotionRecord* r = s_.timelines.awaiting_standby(); r != nullptr && !r->standby_launched) {
    r->standby_launched = now;
  }
}

// --- engine messages ------------------------------------------------------------------------

void Coordinator::StopAndFence(EngineRecord& e, FailCause cause, const std::string& why) {
  s_.Refused(Name(e), why);
  (void)s_.effects.Send(e.id, proto::Stop{.reason = why});
  Fail(e.id, cause, why);
}

void Coordinator::StartDetector(EngineRecord& e) {
  FailureDetector::Options options{.heartbeat_interval = s_.config.heartbeat_interval,
                                   .misses = s_.config.heartbeat_misses,
                                   .probe_timeout = s_.config.probe_timeout};
  e.detector.emplace(s_.clock, options);
  e.last_heartbeat = s_.clock.Now();
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
  if (Status added = s_.ledger->AddStandby(e.id); !added.ok()) {
    return Fail(e.id, FailCause::kMisbehaved, added.message());
  }
  e.version = reg.engine_version;
  e.http_address = reg.http_address;
  if (!SendOrFail(e, SendRegisterAck{})) return;
  s_.Step(e.machine, EngineEvent::kRegisterAccepted);
  StartDetector(e);
  SaveRoster();  // its address and version, for a controller restarted from here on
  BATON_LOG(INFO, kLog) << Name(e) << " (pid " << e.pid << ") registered: version " << e.version
                        << ", http " << e.http_address;
  if (recovery_.has_value()) TickRecovery();
}

void Coordinator::OnShareMemoryAck(EngineRecord& e, const proto::ShareMemoryAck& msg) {
  if (!s_.cuda_backend || !s_.effects.DeviceMemoryPresent() || !e.is(EngineState::kRegistering)) {
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
  s_.Step(e.machine, EngineEvent::kRegistered);
  e.ready_at = s_.clock.Now();
  e.deadline.reset();
  e.prefault_us = msg.prefault_us;
  BATON_LOG(INFO, kLog) << Name(e) << " is a half-started standby: " << msg.arena_mapped_bytes
                        << " weight bytes mapped read-only (pre-faulted in "
                        << msg.prefault_us / 1000.0 << " ms), " << msg.reserved_bytes
                        << " bytes of pool range reserved";
  SaveRoster();
  s_.StepPairIfAllowed(PairEvent::kStandbyReady);
  if (PromotionRecord* r = s_.timelines.awaiting_standby(); r != nullptr) {
    r->standby_ready = s_.clock.Now();
  }
  MaybePromote();
  const EngineRecord* p = s_.Find(s_.primary);
  if (IsCanary(e.id) && p != nullptr && p->serving()) StartCanary(e);
  PublishRoutes();
  MaybeLaunch();
}

bool Coordinator::CheckEpoch(EngineRecord& e, uint64_t epoch, const char* what) {
  // A heartbeat sent before the engine saw its Promote still carries the standby's 0.
  if (epoch == 0 && e.is(EngineState::kPromoting)) return true;
  Status ok = s_.ledger->CheckMessage(e.id, epoch);
  if (ok.ok()) return true;
  const std::string why = std::string(what) + " refused: " + ok.message();
  s_.Refused(Name(e), why);
  (void)s_.effects.Send(e.id, proto::ErrorMsg::FromStatus(FailedPrecondition(why)));
  (void)s_.effects.Send(e.id, proto::Stop{.reason = why});
  Fail(e.id, FailCause::kStale, why);
  return false;
}

void Coordinator::OnHeartbeat(EngineRecord& e, const proto::Heartbeat& msg) {
  if (!CheckEpoch(e, msg.epoch, "Heartbeat")) return;
  if (e.detector.has_value()) e.detector->OnHeartbeat();
  ++e.heartbeats;
  e.last_heartbeat = s_.clock.Now();
}

void Coordinator::OnLeaseRequest(EngineRecord& e, const proto::LeaseRequest& msg) {
  if (!CheckEpoch(e, msg.epoch, "LeaseRequest")) return;
  Result<std::vector<Extent>> granted = s_.ledger->Grant(e.id, msg.blocks, msg.epoch);
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
    Status returned = s_.ledger->Return(e.id, Extent{r.first, r.count}, msg.epoch);
    if (!returned.ok()) return RefuseEngine(e, returned);
  }
  BATON_LOG(INFO, kLog) << Name(e) << " returned " << msg.extents.size() << " extents";
  if (e.id == s_.primary) OnPrimaryReturned();
  SaveRoster();
}

void Coordinator::RefuseEngine(EngineRecord& e, const Status& status) {
  s_.Refused(Name(e), status.message());
  if (!e.connected) return;
  // An engine that took nothing for send_timeout, or fell too far behind, cannot be sent
  // this: it is fenced, as for any other message it cannot be sent.
  SendOrFail(e, proto::ErrorMsg::FromStatus(status));
}

}  // namespace baton
