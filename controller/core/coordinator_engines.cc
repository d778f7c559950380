// EnginePart: launching engines and handling their messages (coordinator_engines.h).
#include "controller/core/coordinator_engines.h"

#include <algorithm>
#include <charconv>
#include <utility>

#include "base/bug.h"
#include "base/failpoint.h"
#include "base/log.h"
#include "base/text/constant_time.h"
#include "base/text/utf8.h"
#include "controller/core/coordinator_parts.h"

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

EnginePart::EnginePart(CoordinatorState& s, const CoordinatorParts& p) : s_(s), p_(p) {}

// --- connections ------------------------------------------------------------------------------

Result<EngineId> EnginePart::Admit(const std::string& token) const {
  if (s_.stopping) return Unavailable("the controller is shutting down");
  const EngineRecord* found = nullptr;
  for (const auto& [id, e] : s_.engines) {  // each compared whole: timing tells no byte
    if (!token.empty() && ConstantTimeEquals(e->token, token)) found = e.get();
  }
  if (found == nullptr) {
    return FailedPrecondition(
        "wrong launch token: engines must be launched by this controller or a previous one "
        "of its state directory");
  }
  if (!found->live()) {
    return FailedPrecondition("engine " + std::to_string(found->id) + " is being fenced");
  }
  if (found->connected || found->registered()) {
    return FailedPrecondition("engine " + std::to_string(found->id) + " is already connected");
  }
  return found->id;
}

void EnginePart::OnConnected(EngineId id, uint16_t protocol) {
  EngineRecord* e = s_.Find(id);
  if (e == nullptr) return;
  e->connected = true;
  e->protocol = protocol;
}

void EnginePart::BeginShutdown() {
  if (s_.stopping) return;
  s_.stopping = true;
  for (auto& [id, e] : s_.engines) {
    if (!e->live()) continue;  // already killed: its exit is on the way
    const Status sent =
        e->connected ? s_.effects.Send(id, proto::Stop{.reason = "the controller is shutting down"})
                     : Unavailable("not connected");
    // An engine that cannot be told (not connected yet, or its connection broke) gets SIGTERM.
    if (!sent.ok()) s_.effects.Terminate(id);
  }
  PublishRoutes();  // an empty table: the engines are stopping
}

// --- launching --------------------------------------------------------------------------------

std::optional<TimePoint> EnginePart::NextLaunchAt() const {
  if (s_.stopping || s_.LiveEngines() >= 2 || p_.recovery->active()) return std::nullopt;
  const PairState s = s_.pair.state();
  if (s == PairState::kStopped || s == PairState::kDraining) return std::nullopt;
  // During a failover the promotion path has the machine to itself; the replacement starts
  // once it is done. At start-up both engines start together.
  if ((s_.promoting != kNoEngine || p_.failover->own().failover.has_value()) &&
      s != PairState::kStarting) {
    return std::nullopt;
  }
  if (s_.cuda_backend && !s_.effects.DeviceMemoryPresent()) return std::nullopt;
  TimePoint at = s_.guard.NextRestartAt();
  if (s_.LiveEngines() == 1) at = std::max(at, s_.relaunch_not_before);  // the new primary first
  return at;
}

void EnginePart::MaybeLaunch() {
  const std::optional<TimePoint> at = NextLaunchAt();
  if (!at.has_value()) return;
  if (s_.LiveEngines() == 1 && s_.clock.Now() < s_.relaunch_not_before) return;
  if (s_.guard.InBackoff()) {
    if (!s_.backoff() && s_.pair.Allows(PairEvent::kCrashLoopTripped)) {
      s_.StepPair(PairEvent::kCrashLoopTripped);
      BATON_LOG(WARN, kLog) << "crash loop (trip " << s_.guard.level()
                            << " in a row): engine restarts held back for "
                            << MillisBetween(s_.clock.Now(), s_.guard.backoff_until()) << " ms";
    }
    return;
  }
  if (s_.backoff()) s_.StepPair(PairEvent::kBackoffElapsed);
  if (!s_.guard.TryStartRestart()) return;
  Launch(s_.primary != kNoEngine || s_.LiveEngines() > 0 ? proto::LaunchRole::kStandby
                                                         : proto::LaunchRole::kPrimary);
}

int EnginePart::PickPort() const {
  if (s_.config.base_port == 0) return 0;
  for (int k = 0; k < s_.config.port_count; ++k) {
    const int port = s_.config.base_port + k;
    bool used = false;
    for (const auto& [id, e] : s_.engines) used = used || e->port == port;
    if (!used) return port;
  }
  return s_.config.base_port;
}

void EnginePart::Launch(proto::LaunchRole role) {
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
  rec->command = p_.upgrades->CommandFor(id, role);
  ++s_.launches;
  EngineRecord& e = *rec;
  s_.engines[id] = std::move(rec);
  Result<pid_t> pid = s_.effects.Launch(
      LaunchSpec{.id = id, .role = role, .token = e.token, .port = e.port, .command = e.command});
  if (!pid.ok()) {
    BATON_LOG(ERROR, kLog) << "engine " << id << " (" << proto::ToString(role)
                           << ") failed to launch: " << pid.status().ToString();
    s_.RecordExit(e, "launch failed", pid.status().message());
    s_.Forget(id);
    s_.effects.Release(id);
    if (!p_.upgrades->IsCanary(id)) {
      (void)s_.guard.RecordFailure();
    } else {
      p_.upgrades->EndUpgrade(UpgradeOutcome::kRolledBack,
                              "the canary failed to launch: " + pid.status().message());
    }
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

// --- engine messages ----------------------------------------------------------------------------

void EnginePart::StopAndFence(EngineRecord& e, FailCause cause, const std::string& why) {
  s_.Refused(Name(e), why);
  (void)s_.effects.Send(e.id, proto::Stop{.reason = why});
  p_.failover->Fence(e.id, cause, why);
}

void EnginePart::StartDetector(EngineRecord& e) {
  FailureDetector::Options options{.heartbeat_interval = s_.config.heartbeat_interval,
                                   .misses = s_.config.heartbeat_misses,
                                   .probe_timeout = s_.config.probe_timeout};
  e.detector.emplace(s_.clock, options);
  e.last_heartbeat = s_.clock.Now();
}

void EnginePart::OnRegister(EngineRecord& e, const proto::Register& reg) {
  if (e.registered()) return RefuseEngine(e, FailedPrecondition("already registered"));
  if (e.adopted && !p_.recovery->AcceptRegister(e)) return;
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
    return p_.failover->Fence(e.id, FailCause::kMisbehaved, added.message());
  }
  e.version = reg.engine_version;
  e.http_address = reg.http_address;
  if (!SendOrFail(e, SendRegisterAck{})) return;
  s_.Step(e.machine, EngineEvent::kRegisterAccepted);
  StartDetector(e);
  SaveRoster();  // its address and version, for a controller restarted from here on
  BATON_LOG(INFO, kLog) << Name(e) << " (pid " << e.pid << ") registered: version " << e.version
                        << ", http " << e.http_address;
  if (p_.recovery->active()) p_.recovery->TickRecovery();
}

void EnginePart::OnStandbyReady(EngineRecord& e, const proto::StandbyReady& msg) {
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
  p_.failover->MaybePromote();
  const EngineRecord* p = s_.Find(s_.primary);
  if (p_.upgrades->IsCanary(e.id) && p != nullptr && p->serving()) p_.upgrades->StartCanary(e);
  PublishRoutes();
  MaybeLaunch();
}

bool EnginePart::CheckEpoch(EngineRecord& e, uint64_t epoch, const char* what) {
  // A heartbeat sent before the engine saw its Promote still carries the standby's 0.
  if (epoch == 0 &&
      (e.is(EngineState::kPromoting) || s_.mutation == CoordinatorMutation::kAcceptEpochZero)) {
    return true;
  }
  Status ok = s_.ledger->CheckMessage(e.id, epoch);
  if (ok.ok()) return true;
  const std::string why = std::string(what) + " refused: " + ok.message();
  s_.Refused(Name(e), why);
  (void)s_.effects.Send(e.id, proto::ErrorMsg::FromStatus(FailedPrecondition(why)));
  (void)s_.effects.Send(e.id, proto::Stop{.reason = why});
  p_.failover->Fence(e.id, FailCause::kStale, why);
  return false;
}

void EnginePart::OnHeartbeat(EngineRecord& e, const proto::Heartbeat& msg) {
  if (!CheckEpoch(e, msg.epoch, "Heartbeat")) return;
  if (e.detector.has_value()) e.detector->OnHeartbeat();
  p_.upgrades->OnHeartbeat(e.id);
  ++e.heartbeats;
  e.last_heartbeat = s_.clock.Now();
}

void EnginePart::OnProgress(EngineRecord& e, const proto::Progress& msg) {
  if (!CheckEpoch(e, msg.epoch, "Progress")) return;
  if (s_.config.compute_stall_timeout <= Duration::zero()) return;
  if (!e.progress.has_value()) {
    e.progress.emplace(
        s_.clock, ProgressWatch::Options{
                      .stall_timeout = s_.config.compute_stall_timeout,
                      .fresh_within = s_.config.heartbeat_interval * s_.config.heartbeat_misses});
  }
  e.progress->OnReport(msg.steps_done, msg.work_pending);
}

void EnginePart::OnLeaseRequest(EngineRecord& e, const proto::LeaseRequest& msg) {
  if (!CheckEpoch(e, msg.epoch, "LeaseRequest")) return;
  Result<std::vector<Extent>> granted = s_.ledger->Grant(e.id, msg.blocks, msg.epoch);
  if (!granted.ok()) return RefuseEngine(e, granted.status());
  SaveRoster();                    // before the engine can map them
  BATON_FAILPOINT("after_grant");  // granted and in the roster, not sent
  BATON_LOG(INFO, kLog) << "granted " << msg.blocks << " blocks to " << Name(e) << " at epoch "
                        << msg.epoch;
  SendOrFail(e, proto::Grant{.epoch = msg.epoch, .extents = ToRanges(*granted)});
}

void EnginePart::OnReturn(EngineRecord& e, const proto::ReturnExtents& msg) {
  if (!CheckEpoch(e, msg.epoch, "ReturnExtents")) return;
  // Each extent is taken back on its own: those before a refused one are free already, and
  // are accounted for (roster, Reclaim) as any return is.
  uint32_t returned = 0;
  size_t extents = 0;
  Status refused = OkStatus();
  for (const proto::BlockRange& r : msg.extents) {
    refused = s_.ledger->Return(e.id, Extent{r.first, r.count}, msg.epoch);
    if (!refused.ok()) break;
    returned += r.count;
    ++extents;
  }
  if (extents > 0) {
    BATON_LOG(INFO, kLog) << Name(e) << " returned " << returned << " blocks in " << extents
                          << " extents";
    if (e.id == s_.primary) p_.upgrades->OnPrimaryReturned();
    SaveRoster();
  }
  if (!refused.ok()) RefuseEngine(e, refused);
}

void EnginePart::RefuseEngine(EngineRecord& e, const Status& status) {
  s_.Refused(Name(e), status.message());
  if (!e.connected) return;
  // An engine that took nothing for send_timeout, or fell too far behind, cannot be sent
  // this: it is fenced, as for any other message it cannot be sent.
  SendOrFail(e, proto::ErrorMsg::FromStatus(status));
}

bool EnginePart::SendOrFail(EngineRecord& e, const ToEngine& message) {
  const Status sent = s_.effects.Send(e.id, message);
  if (sent.ok()) return true;
  p_.failover->Fence(e.id, FailCause::kEof,
                     std::string("sending ") + ToEngineName(message) + ": " + sent.message());
  return false;
}

void EnginePart::GrantFree(EngineRecord& e, uint32_t blocks, const char* who) {
  const uint64_t epoch = s_.ledger->engine(e.id)->epoch;
  Result<std::vector<Extent>> granted = s_.ledger->Grant(e.id, blocks, epoch);
  if (!granted.ok()) {
    BATON_BUG("ledger") << "granting " << blocks << " blocks to engine " << e.id << " (" << who
                        << "): " << granted.status().ToString();
    return;
  }
  SaveRoster();                    // before the engine can map them
  BATON_FAILPOINT("after_grant");  // granted and in the roster, not sent
  BATON_LOG(INFO, kLog) << "granted " << blocks << " free blocks to engine " << e.id << " (" << who
                        << ")";
  SendOrFail(e, proto::Grant{.epoch = epoch, .extents = ToRanges(*granted)});
  s_.CheckInvariants();
}

void EnginePart::OnKvAdopted(EngineRecord& e, const proto::KvAdopted& msg) {
  if (!CheckEpoch(e, msg.epoch, "KvAdopted")) return;
  constexpr size_t kMaxReasons = 16;
  constexpr size_t kMaxReasonBytes = 32;
  bool sane = msg.epoch != 0 && msg.dropped_reasons.size() == msg.dropped_counts.size() &&
              msg.dropped_reasons.size() <= kMaxReasons;
  for (const std::string& reason : msg.dropped_reasons) {
    sane = sane && !reason.empty() && reason.size() <= kMaxReasonBytes &&
           std::all_of(reason.begin(), reason.end(),
                       [](char c) { return (c >= 'a' && c <= 'z') || c == '_'; });
  }
  if (!sane) {  // a report, not a claim on memory: refused, nothing else changes
    return s_.Refused("engine " + std::to_string(e.id), "malformed KvAdopted");
  }
  PromotionRecord::KvAdoption kv;
  kv.adopted = msg.adopted;
  kv.tokens = msg.tokens;
  kv.read_ms = msg.micros / 1e3;
  for (size_t i = 0; i < msg.dropped_reasons.size(); ++i) {
    kv.dropped[msg.dropped_reasons[i]] += msg.dropped_counts[i];
  }
  BATON_LOG(INFO, kLog) << "engine " << e.id << " at epoch " << msg.epoch << " "
                        << KvAdoptionText(kv);
  if (PromotionRecord* r = s_.timelines.Promoted(e.id, msg.epoch); r != nullptr) {
    r->kv_adopted = s_.clock.Now();
    r->kv = std::move(kv);
  }
}

void EnginePart::OnKvInherited(EngineRecord& e, const proto::KvInherited& msg) {
  if (!CheckEpoch(e, msg.epoch, "KvInherited")) return;
  if (msg.epoch == 0 || msg.mode > static_cast<uint8_t>(proto::KvInheritMode::kWaited)) {
    return s_.Refused("engine " + std::to_string(e.id), "malformed KvInherited");
  }
  const PromotionRecord::KvInheritance kv{.mode = static_cast<proto::KvInheritMode>(msg.mode),
                                          .blocks = msg.blocks,
                                          .bytes = msg.bytes,
                                          .ms = msg.micros / 1e3,
                                          .estimate_ms = msg.estimate_us / 1e3};
  BATON_LOG(INFO, kLog) << "engine " << e.id << " at epoch " << msg.epoch
                        << ", the quarantined kv: " << InheritanceText(kv);
  if (PromotionRecord* r = s_.timelines.Promoted(e.id, msg.epoch); r != nullptr) {
    r->kv_inherited = kv;
  }
}

}  // namespace baton
