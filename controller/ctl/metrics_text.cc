// MetricsText: the controller's gauges and counters in Prometheus text (ctl_service.h), one
// section per group of families, in the order they are written.

#include <algorithm>
#include <sstream>

#include "base/bug.h"
#include "base/text/metric_number.h"
#include "controller/ctl/ctl_fleet.h"
#include "controller/ctl/ctl_service.h"
#include "controller/ctl/degradations.h"
#include "controller/upgrade/ctl_upgrade.h"

namespace baton {
namespace {

// The # HELP and # TYPE lines of one family.
void Family(std::ostream& out, const char* name, const char* type, const char* help) {
  out << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n";
}

void Gauge(std::ostream& out, const char* name, const char* help, double v) {
  Family(out, name, "gauge", help);
  out << name << " " << MetricNumber(v) << "\n";
}

void Counter(std::ostream& out, const char* name, const char* help, double v) {
  Family(out, name, "counter", help);
  out << name << " " << MetricNumber(v) << "\n";
}

// The pair, its engines and the pool's blocks.
void PairMetrics(const ControllerStatus& c, std::ostream& out) {
  const CoordinatorStatus& core = c.core;
  const LedgerSnapshot& s = core.ledger;
  Gauge(out, "baton_epoch", "Durable fencing epoch", static_cast<double>(c.journal.durable));
  Gauge(out, "baton_pair_ready", "1 when the pair has a serving primary and a ready standby",
        core.pair_state == PairState::kReady ? 1 : 0);
  Gauge(out, "baton_pair_serving", "1 when a primary serves", PairServes(core.pair_state) ? 1 : 0);
  Gauge(out, "baton_engines", "Engines not being fenced", static_cast<double>(core.engines.size()));
  Gauge(out, "baton_pool_blocks_free", "Free pool blocks", s.free_blocks);
  Gauge(out, "baton_pool_blocks_granted", "Granted pool blocks", s.granted_blocks);
  Gauge(out, "baton_pool_blocks_quarantined", "Quarantined pool blocks", s.quarantined_blocks);
  Gauge(out, "baton_promotion_reserve_blocks",
        "Free blocks kept for a promotion before the old primary's barrier",
        core.reserve_available);
  Gauge(out, "baton_promotion_reserve_target_blocks",
        "The promotion reserve's size (0: none, every promotion waits for the barrier)",
        core.reserve_target);
  Family(out, "baton_engine_blocks", "gauge", "Pool blocks leased to each engine");
  for (const EngineStatus& e : core.engines) {
    out << "baton_engine_blocks{engine_id=\"" << e.id << "\",role=\"" << proto::ToString(e.role)
        << "\"} " << e.ledger.blocks << "\n";
  }
}

// The weight arena: its size and how it is paged.
void WeightsMetrics(const ControllerStatus& c, std::ostream& out) {
  Gauge(out, "baton_weights_bytes", "Weight arena bytes resident",
        static_cast<double>(c.weights.arena_bytes));
  Family(out, "baton_weights_arena_bytes", "gauge",
         "Weight arena bytes by page size (a partial arena has both)");
  out << "baton_weights_arena_bytes{pages=\"2M\"} " << c.weights.huge_bytes << "\n"
      << "baton_weights_arena_bytes{pages=\"4K\"} " << c.weights.small_bytes << "\n";
}

// Restarts held back, and how engines are fenced and their teardown awaited.
void FencingMetrics(const ControllerStatus& c, std::ostream& out) {
  const CoordinatorStatus& core = c.core;
  Gauge(out, "baton_crash_loop_backoff", "1 while restarts are held back",
        core.guard_in_backoff ? 1 : 0);
  Gauge(out, "baton_engine_cgroups",
        "1 while each engine runs in a cgroup that a fence kills whole",
        !c.cgroup_base.empty() ? 1 : 0);
  Gauge(out, "baton_engines_liveness_watched",
        "Engines whose death is seen by their liveness page, before their teardown",
        static_cast<double>(c.liveness_watched.size()));
  Gauge(out, "baton_cgroups_awaiting_removal",
        "Cgroups of gone engines whose removal waits for their last members to exit",
        static_cast<double>(c.cgroups_awaiting_removal));
  Gauge(out, "baton_barrier_waits", "Reaped holders whose blocks wait for the fencing barrier",
        static_cast<double>(core.barrier_waits));
  Gauge(out, "baton_invariants_ok", "1 while no fencing invariant is violated",
        core.invariants.ok() ? 1 : 0);
}

// What the coordinator counted: launches, failovers, failures, refusals, timer runs.
void EventCounters(const CoordinatorStatus& core, std::ostream& out) {
  Counter(out, "baton_engine_launches_total", "Engine processes launched",
          static_cast<double>(core.launches));
  Counter(out, "baton_failovers_total",
          "Primaries lost (died, hung, failed); a drain, switch-over or upgrade is not counted",
          static_cast<double>(core.failovers));
  Counter(out, "baton_engine_compute_stalls_total",
          "Engines fenced as hung because their own progress reports showed requests pending "
          "and no compute step finished for compute_stall_timeout_ms",
          static_cast<double>(core.compute_stalls));
  Counter(out, "baton_switchovers_called_off_total",
          "Switch-overs whose standby failed while the primary drained; the primary served on",
          static_cast<double>(core.called_off_switchovers));
  Counter(out, "baton_engine_failures_total", "Engine failures seen by the crash-loop guard",
          static_cast<double>(core.guard_total_failures));
  Counter(out, "baton_refusals_total", "Refused messages and connections",
          static_cast<double>(core.refusal_count));
  Counter(out, "baton_controller_ticks_total",
          "Runs of the controller's housekeeping timer (deadlines, restarts, probes)",
          static_cast<double>(core.ticks));
}

// The epoch journal, and the engines whose fence waits for it.
void JournalMetrics(const ControllerStatus& c, std::ostream& out) {
  Gauge(out, "baton_epoch_reserved", "Highest epoch the journal has reserved on disk",
        static_cast<double>(c.journal.reserved));
  Gauge(out, "baton_epoch_journal_ok", "1 while the latest write of the epoch journal succeeded",
        c.journal.last_write.ok() ? 1 : 0);
  Counter(out, "baton_epoch_journal_write_failures_total", "Failed writes of the epoch journal",
          static_cast<double>(c.journal.write_failures));
  Gauge(out, "baton_unfenced_reaped",
        "Reaped engines whose blocks wait for a durable epoch to be fenced at",
        static_cast<double>(c.core.unfenced_reaped.size()));
}

// The GPU's losses and rebuilds, on the CUDA backend only.
void DeviceMetrics(const ControllerStatus& c, std::ostream& out) {
  const CoordinatorStatus& core = c.core;
  if (!core.cuda_backend) return;
  Gauge(out, "baton_device_lost", "1 while the device memory is lost and being rebuilt",
        !c.device.present ? 1 : 0);
  Counter(out, "baton_device_losses_total", "Times the GPU was found lost",
          static_cast<double>(core.device_losses));
  Counter(out, "baton_device_rebuilds_total", "Times the device memory was rebuilt",
          static_cast<double>(core.device_rebuilds));
}

// What the controller found wrong in itself: each one is a bug.
void SelfCheckMetrics(const CoordinatorStatus& core, std::ostream& out) {
  Counter(out, "baton_refused_transitions_total",
          "State transitions the tables refused: each one is a bug in the controller",
          static_cast<double>(core.refused_transitions));
  Counter(out, "baton_bugs_total",
          "Bugs the controller found in itself and lived through (base/bug.h): each one is a bug",
          static_cast<double>(BugCount()));
}

// This controller's start (what it re-adopted of the previous one's) and baton-keeper.
void RestartMetrics(const ControllerStatus& c, std::ostream& out) {
  const RecoveryStatus& r = c.core.recovery;
  Counter(out, "baton_controller_restarts_total",
          "Controllers started on this state directory before this one",
          static_cast<double>(c.restarts));
  Gauge(out, "baton_controller_recovering",
        "1 while a restarted controller waits for the previous one's engines",
        r.in_progress ? 1 : 0);
  Gauge(out, "baton_controller_readopted_engines",
        "Engines of the previous controller this one re-adopted at its start",
        static_cast<double>(r.readopted.size()));
  Gauge(out, "baton_controller_unaccounted_engines",
        "Engines of the previous controller this one fenced at its start",
        static_cast<double>(r.fenced.size()));
  if (r.readopt_ms.has_value()) {
    Gauge(out, "baton_controller_readopt_ms",
          "Process start to the pair ready again with the same engines, at this start",
          *r.readopt_ms);
  }
  Counter(out, "baton_keeper_restarts_total",
          "baton-keeper processes started after the one keeping the memory died",
          static_cast<double>(c.keeper.restarts));
  Family(out, "baton_keeper_state", "gauge",
         "1 for baton-keeper's state now (keeping, restarting, unavailable, off)");
  for (KeeperState k : {KeeperState::kKeeping, KeeperState::kRestarting, KeeperState::kUnavailable,
                        KeeperState::kOff}) {
    out << "baton_keeper_state{state=\"" << ToString(k) << "\"} " << (c.keeper.state == k ? 1 : 0)
        << "\n";
  }
  Gauge(out, "baton_weights_adopted",
        "1 when the weights were taken over from a previous controller",
        c.weights.load_method == "adopted" ? 1 : 0);
}

// The last failover phase by phase (not a planned hand-over nor a first promotion: the
// "slowest failover" rules read it), then each promotion kept in the timeline (the last 16).
void TimelineMetrics(const CoordinatorStatus& core, std::ostream& out) {
  const auto last =
      std::find_if(core.timelines.rbegin(), core.timelines.rend(),
                   [](const PromotionRecord& r) { return r.kind == PromotionKind::kFailover; });
  if (last != core.timelines.rend()) {
    const PhaseTimes p = PhasesOf(*last);
    if (p.ready_ms.has_value()) {
      Gauge(out, "baton_last_failover_ready_ms", "Detection to route published, last failover",
            *p.ready_ms);
    }
    Family(out, "baton_last_failover_phase_ms", "gauge",
           "Each phase of the last failover (batonctl timeline): detect, fence, promote, ready");
    for (const auto& [phase, ms] :
         {std::pair{"detect", p.detect_ms}, std::pair{"fence", p.fence_ms},
          std::pair{"promote", p.promote_ms}, std::pair{"ready", p.ready_ms}}) {
      if (ms.has_value()) {
        out << "baton_last_failover_phase_ms{phase=\"" << phase << "\"} " << MetricNumber(*ms)
            << "\n";
      }
    }
  }
  auto per_failover = [&](const char* name, const char* help, auto value) {
    Family(out, name, "gauge", help);
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
}

}  // namespace

std::string MetricsText(const ControllerStatus& c) {
  std::ostringstream out;
  PairMetrics(c, out);
  WeightsMetrics(c, out);
  FencingMetrics(c, out);
  EventCounters(c.core, out);
  JournalMetrics(c, out);
  out << FleetMetrics(c);
  Gauge(out, "baton_client_send_queued_bytes",
        "Bytes the connections of batonctl and routers hold unsent together",
        static_cast<double>(c.client_send_queued_bytes));
  DeviceMetrics(c, out);
  SelfCheckMetrics(c.core, out);
  RestartMetrics(c, out);
  out << UpgradeMetrics(c);
  out << DegradationMetrics(c);
  TimelineMetrics(c.core, out);
  return out.str();
}

}  // namespace baton
