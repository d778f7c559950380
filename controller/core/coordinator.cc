#include "controller/core/coordinator.h"

#include <algorithm>

#include "base/log.h"

namespace baton {
namespace {

constexpr const char* kLog = "controller";
constexpr Duration kMaxTickInterval = std::chrono::milliseconds(250);
// How often the barrier asks whether a reaped holder's processes (and GPU context) are gone.
constexpr Duration kBarrierPoll = std::chrono::milliseconds(1);

template <class... Fs>
struct Overloaded : Fs... {
  using Fs::operator()...;
};
template <class... Fs>
Overloaded(Fs...) -> Overloaded<Fs...>;

const char* FromEngineName(const FromEngine& m) {
  static constexpr const char* kNames[] = {
      "Register",      "Reattach",    "StandbyReady", "Heartbeat", "LeaseRequest",
      "ReturnExtents", "ErrorReport", "PromoteAck",   "Drained",   "ShareMemoryAck",
      "ErrorMsg",      "KvAdopted",   "KvInherited"};
  static_assert(std::size(kNames) == std::variant_size_v<FromEngine>);
  return kNames[m.index()];
}

}  // namespace

Coordinator::Coordinator(const ControllerConfig& config, const Clock& clock, EpochStore& epochs,
                         Effects& effects)
    : s_(config, clock, epochs, effects) {}

Coordinator::~Coordinator() = default;

void Coordinator::SetLedgerMutationForTesting(PoolLedger::Mutation mutation) {
  s_.ledger_mutation = mutation;
  s_.ledger->SetMutationForTesting(mutation);
}

// --- start ------------------------------------------------------------------------------------

void Coordinator::Start(const StartState& found) {
  s_.incarnation = found.incarnation;
  s_.cuda_backend = found.cuda_backend;
  next_device_probe_ = s_.clock.Now() + s_.config.gpu_probe_interval;
  if (found.blocks_per_chunk > 1) {
    if (Status s = s_.ledger->SetBlocksPerChunk(found.blocks_per_chunk); !s.ok()) {
      BATON_LOG(ERROR, kLog) << "pool chunks: " << s.ToString();
    }
  }
  SetUpReserve(/*announce=*/true);
  LoadCommands(found);
  ReplenishEpochs();
  if (found.roster.has_value() && !found.roster->engines.empty()) {
    BeginRecovery(found);
  } else {
    if (found.roster.has_value()) s_.next_engine_id = found.roster->next_engine_id;
    last_recovery_.roster = found.roster_refused.empty() ? "none" : found.roster_refused;
    last_recovery_.memory = found.memory_adopted ? "adopted" : found.memory_reason;
    SaveRoster();
  }
  PublishRoutes();
  MaybeLaunch();
}

void Coordinator::BeginShutdown() {
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
}

std::vector<EngineId> Coordinator::Remaining() const {
  std::vector<EngineId> ids;
  for (const auto& [id, e] : s_.engines) ids.push_back(id);
  return ids;
}

// --- connections and messages -------------------------------------------------------------------

Result<EngineId> Coordinator::Admit(const std::string& token) const {
  if (s_.stopping) return Unavailable("the controller is shutting down");
  const EngineRecord* found = nullptr;
  for (const auto& [id, e] : s_.engines) {
    if (!token.empty() && e->token == token) found = e.get();
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

void Coordinator::OnConnected(EngineId id, uint16_t protocol) {
  EngineRecord* e = s_.Find(id);
  if (e == nullptr) return;
  e->connected = true;
  e->protocol = protocol;
}

void Coordinator::OnMessage(EngineId id, const FromEngine& m) {
  EngineRecord* found = s_.Find(id);
  if (found == nullptr || !found->live() || !found->connected) return;
  EngineRecord& e = *found;
  const bool opening =
      std::holds_alternative<proto::Register>(m) || std::holds_alternative<proto::Reattach>(m);
  if (!e.registered() && !opening) {
    return RefuseEngine(
        e, FailedPrecondition(std::string("expected Register, got ") + FromEngineName(m)));
  }
  std::visit(Overloaded{
                 [&](const proto::Register& r) { OnRegister(e, r); },
                 [&](const proto::Reattach& r) { OnReattach(e, r); },
                 [&](const proto::StandbyReady& r) { OnStandbyReady(e, r); },
                 [&](const proto::Heartbeat& r) { OnHeartbeat(e, r); },
                 [&](const proto::LeaseRequest& r) { OnLeaseRequest(e, r); },
                 [&](const proto::ReturnExtents& r) { OnReturn(e, r); },
                 [&](const proto::ErrorReport& r) { Fail(id, FailCause::kError, r.message); },
                 [&](const proto::PromoteAck& r) { OnPromoteAck(e, r); },
                 [&](const proto::Drained& r) { OnDrained(e, r); },
                 [&](const proto::ShareMemoryAck& r) { OnShareMemoryAck(e, r); },
                 [&](const proto::KvAdopted& r) { OnKvAdopted(e, r); },
                 [&](const proto::KvInherited& r) { OnKvInherited(e, r); },
                 [&](const proto::ErrorMsg& r) {
                   BATON_LOG(WARN, kLog)
                       << "engine " << id << " refused a controller message: " << r.message;
                 },
             },
             m);
  s_.CheckInvariants();
}

void Coordinator::OnBadMessage(EngineId id, const std::string& what) {
  EngineRecord* e = s_.Find(id);
  if (e == nullptr || !e->live()) return;
  s_.Refused("engine " + std::to_string(id), what);
  Fail(id, FailCause::kEof, what);
}

void Coordinator::OnUnexpectedMessage(EngineId id, const std::string& type) {
  EngineRecord* e = s_.Find(id);
  if (e == nullptr || !e->live()) return;
  RefuseEngine(*e, InvalidArgument("unexpected " + type + " from an engine"));
}

void Coordinator::OnDisconnected(EngineId id, const std::string& reason, bool error) {
  EngineRecord* e = s_.Find(id);
  if (e == nullptr) return;
  e->connected = false;
  if (s_.stopping || !e->live()) return;  // after Stop, a close is the engine's goodbye
  if (error) s_.Refused("engine " + std::to_string(id), "protocol error: " + reason);
  Fail(id, FailCause::kEof, reason);
}

void Coordinator::OnExited(EngineId id, const std::string& how) {
  EngineRecord* e = s_.Find(id);
  if (e == nullptr) return;
  if (s_.stopping) {
    BATON_LOG(INFO, kLog) << "engine " << id << " (pid " << e->pid << ") "
                          << (e->live() ? "exited after Stop" : "reaped") << ": " << how;
    s_.RecordExit(*e, e->fail_cause.has_value() ? ToString(*e->fail_cause) : "stopped", how);
    s_.engines.erase(id);
    s_.effects.Release(id);
    if (s_.engines.empty()) SaveRoster();  // a clean stop leaves nothing to re-adopt
    return;
  }
  if (e->live()) Fail(id, FailCause::kDied, how);
  BATON_LOG(INFO, kLog) << "engine " << id << " (pid " << e->pid << ") reaped: " << how;
  s_.RecordExit(*e, std::string(ToString(*e->fail_cause)) + ": " + e->fail_reason, how);
  if (recovery_.has_value() && e->adopted && s_.ledger->engine(id) == nullptr) {
    NoteGone(*e, "exited");  // what it held is in the previous controller's quarantine
  } else {
    FinishFence(*e);
  }
  if (recovery_.has_value()) TickRecovery();
  MaybePromote();
  GiveFreeBlocksToPrimary();
  MaybeLaunch();
  PublishRoutes();
  s_.CheckInvariants();
}

// --- timer --------------------------------------------------------------------------------------

void Coordinator::OnTick() {
  if (s_.stopping) return;
  ++s_.ticks;
  if (recovery_.has_value()) TickRecovery();
  TickUpgrade();
  GiveFreeBlocksToPrimary();
  RetireStaleStandbys();
  CheckDevice();
  ReplenishEpochs();
  RetryUnfencedHolders();
  PollBarrierWaits();
  PollEngines();
  MaybePromote();
  RefillReserve();
  MaybeLaunch();
  s_.CheckInvariants();
}

TimePoint Coordinator::NextWakeup() const {
  const TimePoint now = s_.clock.Now();
  TimePoint when = now + kMaxTickInterval;
  for (const auto& [id, e] : s_.engines) {
    if (e->detector.has_value()) when = std::min(when, e->detector->NextDeadline());
    if (e->deadline.has_value()) when = std::min(when, *e->deadline);
  }
  if (const std::optional<TimePoint> launch = NextLaunchAt(); launch.has_value()) {
    when = std::min(when, *launch);
  }
  if (!barrier_waits_.empty()) when = std::min(when, now + kBarrierPoll);
  if (recovery_.has_value()) when = std::min(when, recovery_->deadline);
  if (s_.cuda_backend && s_.config.gpu_probe_interval > Duration::zero()) {
    when = std::min(when, std::max(now, next_device_probe_));
  }
  return std::max(when, now);
}

// --- machines and lookups -----------------------------------------------------------------------

const EngineRecord* Coordinator::engine(EngineId id) const {
  auto it = s_.engines.find(id);
  return it == s_.engines.end() ? nullptr : it->second.get();
}

// --- the roster ---------------------------------------------------------------------------------

namespace {

RosterRole RosterRoleOf(const EngineRecord& e) {
  switch (e.state()) {
    case EngineState::kStandby:
      return RosterRole::kStandby;
    case EngineState::kPromoting:
      return RosterRole::kPromoting;
    case EngineState::kPrimary:
      return RosterRole::kServing;
    case EngineState::kDraining:
      return RosterRole::kDraining;
    case EngineState::kFencing:
    case EngineState::kDead:
      return RosterRole::kFencing;
    default:
      return RosterRole::kLaunching;
  }
}

}  // namespace

Roster Coordinator::MakeRoster() const {
  Roster r;
  r.incarnation = s_.incarnation;
  r.next_engine_id = s_.next_engine_id;
  r.primary = s_.primary;
  r.pair_draining =
      s_.pair.state() == PairState::kDraining || s_.pair.state() == PairState::kStopped;
  // While recovering, an engine that has not reattached yet is still what the previous
  // controller's roster says (its role, epoch and extents, and whether it is the primary).
  const Roster* previous = recovery_.has_value() ? &recovery_->roster : nullptr;
  if (previous != nullptr && s_.primary == kNoEngine) {
    const EngineRecord* p = engine(previous->primary);
    if (p != nullptr && p->is(EngineState::kAdopting)) r.primary = previous->primary;
  }
  for (const auto& [id, e] : s_.engines) {
    if (e->pid == 0) continue;  // not started: nothing can reattach as it
    RosterEngine entry{.id = id,
                       .pid = e->pid,
                       .start_time = 0,
                       .token = e->token,
                       .launch_role = e->launch_role,
                       .port = e->port,
                       .command = e->command,
                       .cgroup = "",
                       .role = RosterRoleOf(*e),
                       .epoch = 0,
                       .extents = {},
                       .version = e->version,
                       .http_address = e->http_address};
    if (const LedgerEngine* le = s_.ledger->engine(id); le != nullptr) entry.epoch = le->epoch;
    // Quarantined leases too: a fenced engine still maps them until it is gone.
    for (const Lease& l : s_.ledger->LeasesOf(id)) entry.extents.push_back(l.extent);
    if (const RosterEngine* was =
            previous != nullptr && e->is(EngineState::kAdopting) ? previous->Find(id) : nullptr;
        was != nullptr) {
      entry.role = was->role;
      entry.epoch = was->epoch;
      entry.extents = was->extents;
    }
    r.engines.push_back(std::move(entry));
  }
  // Engines already reaped whose barrier has not passed yet: a controller restarted from here
  // on must wait for it too before their blocks (its previous incarnation's) move.
  auto gone = [&](EngineId id, pid_t pid) {
    if (s_.engines.count(id) != 0 || r.Find(id) != nullptr) return;
    RosterEngine entry;
    entry.id = id;
    entry.pid = pid;
    entry.role = RosterRole::kFencing;
    if (const LedgerEngine* le = s_.ledger->engine(id); le != nullptr) entry.epoch = le->epoch;
    for (const Lease& l : s_.ledger->LeasesOf(id)) entry.extents.push_back(l.extent);
    r.engines.push_back(std::move(entry));
  };
  for (const auto& [id, wait] : barrier_waits_) gone(id, wait.pid);
  for (const auto& [id, pid] : unfenced_reaped_) gone(id, pid);
  if (recovery_.has_value()) {
    for (const auto& [id, until] : recovery_->gone) {
      const RosterEngine* was = recovery_->roster.Find(id);
      gone(id, was != nullptr ? was->pid : 0);
    }
  }
  return r;
}

void Coordinator::SaveRoster() {
  if (Status saved = s_.effects.SaveRoster(MakeRoster()); !saved.ok()) {
    BATON_LOG(ERROR, kLog) << "the roster is not saved (a restarted controller would fence "
                              "engines it cannot account for): "
                           << saved.ToString();
  }
}

}  // namespace baton

namespace baton {

const char* ToEngineName(const ToEngine& message) {
  static constexpr const char* kNames[] = {
      "RegisterAck", "Promote",  "Grant",         "Reclaim",     "Drain",       "Resume",
      "Stop",        "ErrorMsg", "HealthRequest", "InjectFault", "ReattachAck", "Quarantined"};
  static_assert(std::size(kNames) == std::variant_size_v<ToEngine>);
  return kNames[message.index()];
}

}  // namespace baton
