// Coordinator: its status as one copy (coordinator_status.h).
#include "controller/core/coordinator.h"

namespace baton {

const EngineStatus* CoordinatorStatus::Find(EngineId id) const {
  for (const EngineStatus& e : engines) {
    if (e.id == id) return &e;
  }
  return nullptr;
}

proto::EngineRole Coordinator::RoleOf(const EngineRecord& e) const {
  using proto::EngineRole;
  if (!e.live()) return EngineRole::kFencing;
  if (e.id == primary_) {
    return e.is(EngineState::kDraining) ? EngineRole::kDraining : EngineRole::kPrimary;
  }
  if (IsCanary(e.id) && !e.is(EngineState::kLaunching) && !e.is(EngineState::kRegistering) &&
      !e.is(EngineState::kStandby)) {
    return e.is(EngineState::kPromoting)  ? EngineRole::kPromoting
           : e.is(EngineState::kDraining) ? EngineRole::kDraining
                                          : EngineRole::kCanary;
  }
  if (e.is(EngineState::kPromoting)) return EngineRole::kPromoting;
  if (e.is(EngineState::kStandby)) return EngineRole::kStandby;
  if (e.is(EngineState::kAdopting)) return EngineRole::kAdopting;
  return EngineRole::kLaunching;
}

EngineStatus Coordinator::EngineStatusOf(const EngineRecord& e) const {
  EngineStatus s;
  s.id = e.id;
  s.role = RoleOf(e);
  s.state = e.state();
  s.launch_role = e.launch_role;
  s.pid = e.pid;
  s.adopted = e.adopted;
  if (const LedgerEngine* le = ledger_->engine(e.id); le != nullptr) s.ledger = *le;
  s.leases = ledger_->LeasesOf(e.id);
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

CoordinatorStatus Coordinator::Snapshot() const {
  CoordinatorStatus s;
  s.now = clock_.Now();
  s.pair_state = pair_.state();
  s.pair_history = pair_.history();
  s.primary = primary_;
  for (const auto& [id, e] : engines_) s.engines.push_back(EngineStatusOf(*e));
  s.ledger = ledger_->Snapshot();
  s.invariants = invariants_;
  s.refused_transitions = refused_transitions_;
  s.guard_in_backoff = guard_.InBackoff();
  s.guard_level = guard_.level();
  s.guard_recent_failures = guard_.recent_failures();
  s.guard_total_failures = guard_.total_failures();
  s.guard_next_restart_at = guard_.NextRestartAt();
  s.timelines = timelines_.records();
  s.refusals = refusals_;
  s.exits = exits_;
  s.launches = launches_;
  s.failovers = failovers_;
  s.called_off_switchovers = called_off_switchovers_;
  s.ticks = ticks_;
  s.refusal_count = refusal_count_;
  if (upgrade_.has_value()) {
    const Upgrade& u = *upgrade_;
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
      const OutcomeMap now = effects_.RouterOutcomes();
      us.canary_seen = u.judge->Seen(u.canary, now);
      us.primary_seen = u.judge->Seen(u.judge->primary(), now);
    }
    s.upgrade = std::move(us);
  }
  s.upgrade_history = upgrade_history_;
  s.active_command = active_command();
  s.previous_command = previous_command_;
  s.upgrades_promoted = upgrades_promoted_;
  s.upgrades_rolled_back = upgrades_rolled_back_;
  for (const auto& [id, pid] : unfenced_reaped_) s.unfenced_reaped.push_back(id);
  s.barrier_waits = barrier_waits_.size();
  s.reserve_target = ledger_->promotion_reserve();
  s.reserve_available = ledger_->ReserveAvailable();
  s.reserve_note = reserve_note_;
  s.journal_failing = journal_failing_;
  s.cuda_backend = cuda_backend_;
  s.device_memory_present = effects_.DeviceMemoryPresent();
  s.device_losses = device_losses_;
  s.device_rebuilds = device_rebuilds_;
  s.device_lost_reason = device_lost_reason_;
  s.incarnation = incarnation_;
  s.recovery = recovery_.has_value() ? recovery_->status : last_recovery_;
  return s;
}

}  // namespace baton
