// Coordinator: its status as one copy (coordinator_status.h).
#include "controller/core/coordinator.h"

namespace baton {

const EngineStatus* CoordinatorStatus::Find(EngineId id) const {
  for (const EngineStatus& e : engines) {
    if (e.id == id) return &e;
  }
  return nullptr;
}

namespace {

proto::EngineRole RoleOf(const CoordinatorState& state, const UpgradePart& upgrades,
                         const EngineRecord& e) {
  using proto::EngineRole;
  if (!e.live()) return EngineRole::kFencing;
  if (e.id == state.primary) {
    return e.is(EngineState::kDraining) ? EngineRole::kDraining : EngineRole::kPrimary;
  }
  if (upgrades.IsCanary(e.id) && !e.is(EngineState::kLaunching) &&
      !e.is(EngineState::kRegistering) && !e.is(EngineState::kStandby)) {
    return e.is(EngineState::kPromoting)  ? EngineRole::kPromoting
           : e.is(EngineState::kDraining) ? EngineRole::kDraining
                                          : EngineRole::kCanary;
  }
  if (e.is(EngineState::kPromoting)) return EngineRole::kPromoting;
  if (e.is(EngineState::kStandby)) return EngineRole::kStandby;
  if (e.is(EngineState::kAdopting)) return EngineRole::kAdopting;
  return EngineRole::kLaunching;
}

EngineStatus EngineStatusOf(const CoordinatorState& state, const UpgradePart& upgrades,
                            const EngineRecord& e) {
  EngineStatus s;
  s.id = e.id;
  s.role = RoleOf(state, upgrades, e);
  s.state = e.state();
  s.launch_role = e.launch_role;
  s.pid = e.pid;
  s.adopted = e.adopted;
  if (const LedgerEngine* le = state.ledger->engine(e.id); le != nullptr) s.ledger = *le;
  s.leases = state.ledger->LeasesOf(e.id);
  s.version = e.version;
  s.http_address = e.http_address;
  s.port = e.port;
  s.serving = e.serving();
  s.registered = e.registered();
  s.heartbeats = e.heartbeats;
  s.probes = e.probes;
  s.launched_at = e.launched_at;
  s.last_heartbeat = e.last_heartbeat;
  s.prefault_us = e.prefault_us;
  s.device_memory = e.device_memory;
  if (e.detector.has_value()) s.detector = e.detector->state();
  if (!e.live()) s.fence_reason = e.fail_reason;
  s.command = e.command;
  s.history = e.machine.history();
  return s;
}

}  // namespace

CoordinatorStatus Coordinator::Snapshot() const {
  CoordinatorStatus s;
  s.now = s_.clock.Now();
  s.pair_state = s_.pair.state();
  s.pair_history = s_.pair.history();
  s.departed_history = s_.departed_history;
  s.primary = s_.primary;
  for (const auto& [id, e] : s_.engines) s.engines.push_back(EngineStatusOf(s_, upgrades_, *e));
  s.ledger = s_.ledger->Snapshot();
  s.invariants = s_.invariants;
  s.refused_transitions = s_.refused_transitions;
  s.guard_in_backoff = s_.guard.InBackoff();
  s.guard_level = s_.guard.level();
  s.guard_recent_failures = s_.guard.recent_failures();
  s.guard_total_failures = s_.guard.total_failures();
  s.guard_next_restart_at = s_.guard.NextRestartAt();
  s.timelines = s_.timelines.records();
  s.refusals = s_.refusals;
  s.exits = s_.exits;
  s.launches = s_.launches;
  s.failovers = s_.failovers;
  s.compute_stalls = s_.compute_stalls;
  s.called_off_switchovers = s_.called_off_switchovers;
  s.ticks = s_.ticks;
  s.refusal_count = s_.refusal_count;
  const UpgradeFields& up = upgrades_.own();
  if (up.upgrade.has_value()) {
    const Upgrade& u = *up.upgrade;
    UpgradeStatus us{.kind = u.kind,
                     .phase = u.phase,
                     .primary = u.primary,
                     .canary = u.canary,
                     .command = u.command,
                     .previous = u.previous,
                     .steps = u.policy.steps,
                     .weight = u.judge.has_value() ? u.judge->weight() : 0,
                     .step = std::nullopt,
                     .judgement = u.judgement,
                     .rollback_reason = u.rollback_reason,
                     .started = u.started,
                     .phase_since = u.phase_since,
                     .canary_seen = std::nullopt,
                     .primary_seen = std::nullopt};
    if (u.judge.has_value()) {
      us.step = u.judge->step();
      const OutcomeMap now = s_.effects.RouterOutcomes();
      us.canary_seen = u.judge->Seen(u.canary, now);
      us.primary_seen = u.judge->Seen(u.judge->primary(), now);
    }
    s.upgrade = std::move(us);
  }
  s.upgrade_history = up.history;
  s.active_command = upgrades_.active_command();
  s.previous_command = up.previous_command;
  s.upgrades_promoted = up.promoted;
  s.upgrades_rolled_back = up.rolled_back;
  for (const auto& [id, pid] : failover_.own().unfenced_reaped) s.unfenced_reaped.push_back(id);
  s.barrier_waits = failover_.own().barrier_waits.size();
  s.reserve_target = s_.ledger->promotion_reserve();
  s.reserve_available = s_.ledger->ReserveAvailable();
  s.reserve_note = failover_.own().reserve_note;
  if (s.reserve_note.empty() && s.reserve_target == 0) {
    s.reserve_note = "the promotion reserve is lent to an upgrade's canary until it ends";
  }
  s.journal_failing = s_.journal_failing;
  s.cuda_backend = s_.cuda_backend;
  s.device_memory_present = s_.effects.DeviceMemoryPresent();
  s.device_losses = device_.own().losses;
  s.device_rebuilds = device_.own().rebuilds;
  s.device_lost_reason = device_.own().lost_reason;
  s.incarnation = s_.incarnation;
  s.recovery = recovery_.status();
  return s;
}

}  // namespace baton
