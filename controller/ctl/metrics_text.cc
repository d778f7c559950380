// MetricsText: the controller's gauges and counters in Prometheus text (ctl_service.h).

#include <sstream>

#include "base/bug.h"
#include "base/text/metric_number.h"
#include "controller/ctl/ctl_fleet.h"
#include "controller/ctl/ctl_service.h"
#include "controller/ctl/degradations.h"
#include "controller/upgrade/ctl_upgrade.h"

namespace baton {

std::string MetricsText(const ControllerStatus& c) {
  const CoordinatorStatus& core = c.core;
  const LedgerSnapshot& s = core.ledger;
  std::ostringstream out;
  auto gauge = [&](const char* name, const char* help, double v) {
    out << "# HELP " << name << " " << help << "\n# TYPE " << name << " gauge\n"
        << name << " " << MetricNumber(v) << "\n";
  };
  auto counter = [&](const char* name, const char* help, double v) {
    out << "# HELP " << name << " " << help << "\n# TYPE " << name << " counter\n"
        << name << " " << MetricNumber(v) << "\n";
  };
  gauge("baton_epoch", "Durable fencing epoch", static_cast<double>(c.journal.durable));
  gauge("baton_pair_ready", "1 when the pair has a serving primary and a ready standby",
        core.pair_state == PairState::kReady ? 1 : 0);
  gauge("baton_pair_serving", "1 when a primary serves", PairServes(core.pair_state) ? 1 : 0);
  gauge("baton_engines", "Engines not being fenced", static_cast<double>(core.engines.size()));
  gauge("baton_pool_blocks_free", "Free pool blocks", s.free_blocks);
  gauge("baton_pool_blocks_granted", "Granted pool blocks", s.granted_blocks);
  gauge("baton_pool_blocks_quarantined", "Quarantined pool blocks", s.quarantined_blocks);
  gauge("baton_promotion_reserve_blocks",
        "Free blocks kept for a promotion before the old primary's barrier",
        core.reserve_available);
  gauge("baton_promotion_reserve_target_blocks",
        "The promotion reserve's size (0: none, every promotion waits for the barrier)",
        core.reserve_target);
  out << "# HELP baton_engine_blocks Pool blocks leased to each engine\n"
         "# TYPE baton_engine_blocks gauge\n";
  for (const EngineStatus& e : core.engines) {
    out << "baton_engine_blocks{engine_id=\"" << e.id << "\",role=\"" << proto::ToString(e.role)
        << "\"} " << e.ledger.blocks << "\n";
  }
  gauge("baton_weights_bytes", "Weight arena bytes resident",
        static_cast<double>(c.weights.arena_bytes));
  out << "# HELP baton_weights_arena_bytes Weight arena bytes by page size (a partial arena has "
         "both)\n# TYPE baton_weights_arena_bytes gauge\n"
      << "baton_weights_arena_bytes{pages=\"2M\"} " << c.weights.huge_bytes << "\n"
      << "baton_weights_arena_bytes{pages=\"4K\"} " << c.weights.small_bytes << "\n";
  gauge("baton_crash_loop_backoff", "1 while restarts are held back",
        core.guard_in_backoff ? 1 : 0);
  gauge("baton_engine_cgroups", "1 while each engine runs in a cgroup that a fence kills whole",
        !c.cgroup_base.empty() ? 1 : 0);
  gauge("baton_engines_liveness_watched",
        "Engines whose death is seen by their liveness page, before their teardown",
        static_cast<double>(c.liveness_watched.size()));
  gauge("baton_cgroups_awaiting_removal",
        "Cgroups of gone engines whose removal waits for their last members to exit",
        static_cast<double>(c.cgroups_awaiting_removal));
  gauge("baton_barrier_waits", "Reaped holders whose blocks wait for the fencing barrier",
        static_cast<double>(core.barrier_waits));
  gauge("baton_invariants_ok", "1 while no fencing invariant is violated",
        core.invariants.ok() ? 1 : 0);
  counter("baton_engine_launches_total", "Engine processes launched",
          static_cast<double>(core.launches));
  counter("baton_failovers_total",
          "Primaries lost (died, hung, failed); a drain, switch-over or upgrade is not counted",
          static_cast<double>(core.failovers));
  counter("baton_engine_compute_stalls_total",
          "Engines fenced as hung because their own progress reports showed requests pending "
          "and no compute step finished for compute_stall_timeout_ms",
          static_cast<double>(core.compute_stalls));
  counter("baton_switchovers_called_off_total",
          "Switch-overs whose standby failed while the primary drained; the primary served on",
          static_cast<double>(core.called_off_switchovers));
  counter("baton_engine_failures_total", "Engine failures seen by the crash-loop guard",
          static_cast<double>(core.guard_total_failures));
  counter("baton_refusals_total", "Refused messages and connections",
          static_cast<double>(core.refusal_count));
  counter("baton_controller_ticks_total",
          "Runs of the controller's housekeeping timer (deadlines, restarts, probes)",
          static_cast<double>(core.ticks));
  gauge("baton_epoch_reserved", "Highest epoch the journal has reserved on disk",
        static_cast<double>(c.journal.reserved));
  gauge("baton_epoch_journal_ok", "1 while the latest write of the epoch journal succeeded",
        c.journal.last_write.ok() ? 1 : 0);
  counter("baton_epoch_journal_write_failures_total", "Failed writes of the epoch journal",
          static_cast<double>(c.journal.write_failures));
  gauge("baton_unfenced_reaped",
        "Reaped engines whose blocks wait for a durable epoch to be fenced at",
        static_cast<double>(core.unfenced_reaped.size()));
  out << FleetMetrics(c);
  gauge("baton_client_send_queued_bytes",
        "Bytes the connections of batonctl and routers hold unsent together",
        static_cast<double>(c.client_send_queued_bytes));
  if (core.cuda_backend) {
    gauge("baton_device_lost", "1 while the device memory is lost and being rebuilt",
          !c.device.present ? 1 : 0);
    counter("baton_device_losses_total", "Times the GPU was found lost",
            static_cast<double>(core.device_losses));
    counter("baton_device_rebuilds_total", "Times the device memory was rebuilt",
            static_cast<double>(core.device_rebuilds));
  }
  counter("baton_refused_transitions_total",
          "State transitions the tables refused: each one is a bug in the controller",
          static_cast<double>(core.refused_transitions));
  counter("baton_bugs_total",
          "Bugs the controller found in itself and lived through (base/bug.h): each one is a bug",
          static_cast<double>(BugCount()));
  counter("baton_controller_restarts_total",
          "Controllers started on this state directory before this one",
          static_cast<double>(c.restarts));
  gauge("baton_controller_recovering",
        "1 while a restarted controller waits for the previous one's engines",
        core.recovery.in_progress ? 1 : 0);
  gauge("baton_controller_readopted_engines",
        "Engines of the previous controller this one re-adopted at its start",
        static_cast<double>(core.recovery.readopted.size()));
  gauge("baton_controller_unaccounted_engines",
        "Engines of the previous controller this one fenced at its start",
        static_cast<double>(core.recovery.fenced.size()));
  if (core.recovery.readopt_ms.has_value()) {
    gauge("baton_controller_readopt_ms",
          "Process start to the pair ready again with the same engines, at this start",
          *core.recovery.readopt_ms);
  }
  counter("baton_keeper_restarts_total",
          "baton-keeper processes started after the one keeping the memory died",
          static_cast<double>(c.keeper.restarts));
  out << "# HELP baton_keeper_state 1 for baton-keeper's state now (keeping, restarting, "
         "unavailable, off)\n# TYPE baton_keeper_state gauge\n";
  for (KeeperState k : {KeeperState::kKeeping, KeeperState::kRestarting, KeeperState::kUnavailable,
                        KeeperState::kOff}) {
    out << "baton_keeper_state{state=\"" << ToString(k) << "\"} " << (c.keeper.state == k ? 1 : 0)
        << "\n";
  }
  gauge("baton_weights_adopted", "1 when the weights were taken over from a previous controller",
        c.weights.load_method == "adopted" ? 1 : 0);
  out << UpgradeMetrics(c);
  out << DegradationMetrics(c);
  if (!core.timelines.empty()) {
    const PhaseTimes p = PhasesOf(core.timelines.back());
    if (p.ready_ms.has_value()) {
      gauge("baton_last_failover_ready_ms", "Detection to route published, last promotion",
            *p.ready_ms);
    }
    out << "# HELP baton_last_failover_phase_ms Each phase of the last promotion (batonctl "
           "timeline): detect, fence, promote, ready\n# TYPE baton_last_failover_phase_ms gauge\n";
    for (const auto& [phase, ms] :
         {std::pair{"detect", p.detect_ms}, std::pair{"fence", p.fence_ms},
          std::pair{"promote", p.promote_ms}, std::pair{"ready", p.ready_ms}}) {
      if (ms.has_value())
        out << "baton_last_failover_phase_ms{phase=\"" << phase << "\"} " << MetricNumber(*ms)
            << "\n";
    }
  }
  // Per failover kept in the timeline (the last 16): ready and teardown side by side.
  auto per_failover = [&](const char* name, const char* help, auto value) {
    out << "# HELP " << name << " " << help << "\n# TYPE " << name << " gauge\n";
    for (const PromotionRecord& r : core.timelines) {
      const std::optional<double> v = value(r);
      if (!v.has_value()) continue;
      out << name << "{seq=\"" << r.seq << "\",kind=\"" << ToString(r.kind)
          << "\",before_barrier=\"" << (PromotedBeforeBarrier(r) ? "true" : "false") << "\"} "
          << MetricNumber(*v) << "\n";
    }
  };
  per_failover("baton_failover_ready_ms", "Detection to route published, per promotion kept",
               [](const PromotionRecord& r) { return PhasesOf(r).ready_ms; });
  per_failover("baton_failover_teardown_ms",
               "Detection to the old primary's barrier passed (its blocks out of quarantine), per "
               "promotion kept",
               [](const PromotionRecord& r) { return PhasesOf(r).teardown_ms; });
  per_failover("baton_failover_quarantined_blocks",
               "Blocks of the old primary quarantined at its fence, per promotion kept",
               [](const PromotionRecord& r) -> std::optional<double> {
                 if (r.old_engine == 0) return std::nullopt;
                 return r.quarantined_blocks;
               });
  return out.str();
}

}  // namespace baton
