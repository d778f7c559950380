// Coordinator: each event routed to the parts it concerns (coordinator_parts.h).
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
      "ErrorMsg",      "KvAdopted",   "KvInherited",  "Progress"};
  static_assert(std::size(kNames) == std::variant_size_v<FromEngine>);
  return kNames[m.index()];
}

}  // namespace

Coordinator::Coordinator(const CoordinatorConfig& config, const Clock& clock, EpochStore& epochs,
                         Effects& effects)
    : s_(config, clock, epochs, effects),
      parts_{.engines = &engines_,
             .failover = &failover_,
             .recovery = &recovery_,
             .upgrades = &upgrades_,
             .device = &device_,
             .commands = &commands_},
      engines_(s_, parts_),
      failover_(s_, parts_),
      recovery_(s_, parts_),
      upgrades_(s_, parts_),
      device_(s_, parts_),
      commands_(s_, parts_) {}

Coordinator::~Coordinator() = default;

void Coordinator::SetLedgerMutationForTesting(PoolLedger::Mutation mutation) {
  s_.ledger_mutation = mutation;
  s_.ledger->SetMutationForTesting(mutation);
}

// --- start and stop -----------------------------------------------------------------------------

void Coordinator::Start(const StartState& found) {
  s_.incarnation = found.incarnation;
  device_.Start(found);
  failover_.SetUpReserve(/*announce=*/true);
  upgrades_.LoadCommands(found);
  failover_.ReplenishEpochs();
  if (found.roster.has_value() && !found.roster->engines.empty()) {
    recovery_.BeginRecovery(found);
  } else {
    if (found.roster.has_value()) s_.next_engine_id = found.roster->next_engine_id;
    recovery_.NoteFreshStart(found);
    if (found.roster.has_value() && found.roster->pair_draining) commands_.KeepDrained();
    engines_.SaveRoster();
  }
  engines_.PublishRoutes();
  engines_.MaybeLaunch();
}

void Coordinator::BeginShutdown() { engines_.BeginShutdown(); }

std::vector<EngineId> Coordinator::Remaining() const {
  std::vector<EngineId> ids;
  for (const auto& [id, e] : s_.engines) ids.push_back(id);
  return ids;
}

// --- connections and messages -------------------------------------------------------------------

Result<EngineId> Coordinator::Admit(const std::string& token) const {
  return engines_.Admit(token);
}

void Coordinator::OnConnected(EngineId id, uint16_t protocol) {
  engines_.OnConnected(id, protocol);
}

void Coordinator::OnMessage(EngineId id, const FromEngine& m) {
  EngineRecord* found = s_.Find(id);
  if (found == nullptr || !found->live() || !found->connected) return;
  EngineRecord& e = *found;
  const bool opening =
      std::holds_alternative<proto::Register>(m) || std::holds_alternative<proto::Reattach>(m);
  if (!e.registered() && !opening) {
    return engines_.RefuseEngine(
        e, FailedPrecondition(std::string("expected Register, got ") + FromEngineName(m)));
  }
  std::visit(
      Overloaded{
          [&](const proto::Register& r) { engines_.OnRegister(e, r); },
          [&](const proto::Reattach& r) { recovery_.OnReattach(e, r); },
          [&](const proto::StandbyReady& r) { engines_.OnStandbyReady(e, r); },
          [&](const proto::Heartbeat& r) { engines_.OnHeartbeat(e, r); },
          [&](const proto::Progress& r) { engines_.OnProgress(e, r); },
          [&](const proto::LeaseRequest& r) { engines_.OnLeaseRequest(e, r); },
          [&](const proto::ReturnExtents& r) { engines_.OnReturn(e, r); },
          [&](const proto::ErrorReport& r) { failover_.Fence(id, FailCause::kError, r.message); },
          [&](const proto::PromoteAck& r) { failover_.OnPromoteAck(e, r); },
          [&](const proto::Drained& r) { failover_.OnDrained(e, r); },
          [&](const proto::ShareMemoryAck& r) { device_.OnShareMemoryAck(e, r); },
          [&](const proto::KvAdopted& r) { engines_.OnKvAdopted(e, r); },
          [&](const proto::KvInherited& r) { engines_.OnKvInherited(e, r); },
          [&](const proto::ErrorMsg& r) {
            BATON_LOG(WARN, kLog) << "engine " << id
                                  << " refused a controller message: " << r.message;
          },
      },
      m);
  s_.CheckInvariants();
}

void Coordinator::OnBadMessage(EngineId id, const std::string& what) {
  EngineRecord* e = s_.Find(id);
  if (e == nullptr || !e->live()) return;
  s_.Refused("engine " + std::to_string(id), what);
  failover_.Fence(id, FailCause::kEof, what);
}

void Coordinator::OnUnexpectedMessage(EngineId id, const std::string& type) {
  EngineRecord* e = s_.Find(id);
  if (e == nullptr || !e->live()) return;
  engines_.RefuseEngine(*e, InvalidArgument("unexpected " + type + " from an engine"));
}

// A lost connection (EOF, a reset, a frame that did not decode), a dying process (OnDying)
// and an exit (OnExited) all enter FailoverPart::Fence.
void Coordinator::OnDisconnected(EngineId id, const std::string& reason, bool error) {
  EngineRecord* e = s_.Find(id);
  if (e == nullptr) return;
  e->connected = false;
  if (s_.stopping || !e->live()) return;  // after Stop, a close is the engine's goodbye
  if (error) s_.Refused("engine " + std::to_string(id), "protocol error: " + reason);
  failover_.Fence(id, FailCause::kEof, reason);
}

void Coordinator::OnDying(EngineId id, const std::string& how) {
  EngineRecord* e = s_.Find(id);
  if (e == nullptr || s_.stopping || !e->live()) return;
  failover_.Fence(id, FailCause::kDied, how);
}

void Coordinator::OnExited(EngineId id, const std::string& how) { failover_.OnExited(id, how); }

void Coordinator::OnEngineStalled(EngineId id, const std::string& detail) {
  EngineRecord* e = s_.Find(id);
  if (e == nullptr || s_.stopping || !e->live() || !e->serving()) return;
  if (id != s_.primary && !upgrades_.IsCanary(id)) return;
  failover_.Fence(id, FailCause::kHung, detail);
  s_.CheckInvariants();
}

// --- operator commands --------------------------------------------------------------------------

Status Coordinator::RequestSwitchover() { return commands_.RequestSwitchover(); }
Status Coordinator::RequestDrain() { return commands_.RequestDrain(); }
Status Coordinator::RequestResume() { return commands_.RequestResume(); }
Status Coordinator::Drill(DrillKind kind) { return commands_.Drill(kind); }
Status Coordinator::RequestUpgrade(UpgradeRequest request) {
  return upgrades_.RequestUpgrade(std::move(request));
}
Status Coordinator::RequestRollback(UpgradeRequest overrides) {
  return upgrades_.RequestRollback(std::move(overrides));
}

// --- timer --------------------------------------------------------------------------------------

void Coordinator::OnTick() {
  if (s_.stopping) return;
  ++s_.ticks;
  if (recovery_.active()) recovery_.TickRecovery();
  upgrades_.TickUpgrade();
  upgrades_.GiveFreeBlocksToPrimary();
  upgrades_.RetireStaleStandbys();
  device_.CheckDevice();
  failover_.ReplenishEpochs();
  failover_.RetryUnfencedHolders();
  failover_.PollBarrierWaits();
  engines_.PollEngines();
  failover_.MaybePromote();
  failover_.RefillReserve();
  engines_.MaybeLaunch();
  s_.CheckInvariants();
}

TimePoint Coordinator::NextWakeup() const {
  const TimePoint now = s_.clock.Now();
  TimePoint when = now + kMaxTickInterval;
  for (const auto& [id, e] : s_.engines) {
    if (e->detector.has_value()) when = std::min(when, e->detector->NextDeadline());
    if (e->deadline.has_value()) when = std::min(when, *e->deadline);
    if (const std::optional<TimePoint> due = engines_.ProgressDeadline(*e); due.has_value()) {
      when = std::min(when, *due);
    }
  }
  if (const std::optional<TimePoint> launch = engines_.NextLaunchAt(); launch.has_value()) {
    when = std::min(when, *launch);
  }
  if (!failover_.own().barrier_waits.empty()) when = std::min(when, now + kBarrierPoll);
  if (recovery_.active()) {
    when = std::min(when, recovery_.own().recovery->deadline);
    // The previous controller's engines gone, their barrier polled as a fenced holder's is:
    // their blocks may be owed to an engine that waits for them.
    if (!recovery_.own().recovery->gone.empty()) when = std::min(when, now + kBarrierPoll);
  }
  if (const std::optional<TimePoint> probe = device_.NextProbeAt(); probe.has_value()) {
    when = std::min(when, std::max(now, *probe));
  }
  return std::max(when, now);
}

// --- reads --------------------------------------------------------------------------------------

const EngineRecord* Coordinator::engine(EngineId id) const { return s_.Find(id); }

}  // namespace baton
