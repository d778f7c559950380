// MetricsText: the controller's gauges and counters in Prometheus text (ctl_service.h).
#include <sstream>

#include "controller/ctl/ctl_service.h"
#include "controller/upgrade/ctl_upgrade.h"

namespace baton {

std::string MetricsText(const Controller& c) {
  const LedgerSnapshot s = c.ledger().Snapshot();
  std::ostringstream out;
  auto gauge = [&](const char* name, const char* help, double v) {
    out << "# HELP " << name << " " << help << "\n# TYPE " << name << " gauge\n"
        << name << " " << v << "\n";
  };
  auto counter = [&](const char* name, const char* help, double v) {
    out << "# HELP " << name << " " << help << "\n# TYPE " << name << " counter\n"
        << name << " " << v << "\n";
  };
  gauge("baton_epoch", "Durable fencing epoch", static_cast<double>(c.durable_epoch()));
  gauge("baton_pair_ready", "1 when the pair has a serving primary and a ready standby",
        c.pair().state() == PairState::kReady ? 1 : 0);
  gauge("baton_pair_serving", "1 when a primary serves", PairServes(c.pair().state()) ? 1 : 0);
  gauge("baton_engines", "Engines not being fenced", static_cast<double>(c.engines().size()));
  gauge("baton_pool_blocks_free", "Free pool blocks", s.free_blocks);
  gauge("baton_pool_blocks_granted", "Granted pool blocks", s.granted_blocks);
  gauge("baton_pool_blocks_quarantined", "Quarantined pool blocks", s.quarantined_blocks);
  out << "# HELP baton_engine_blocks Pool blocks leased to each engine\n"
         "# TYPE baton_engine_blocks gauge\n";
  for (const auto& [id, e] : c.engines()) {
    const LedgerEngine* le = c.ledger().engine(id);
    out << "baton_engine_blocks{engine_id=\"" << id << "\",role=\"" << EngineRole(c, *e) << "\"} "
        << (le != nullptr ? le->blocks : 0) << "\n";
  }
  gauge("baton_weights_bytes", "Weight arena bytes resident",
        static_cast<double>(c.weights().arena().size()));
  gauge("baton_crash_loop_backoff", "1 while restarts are held back",
        c.guard().InBackoff() ? 1 : 0);
  gauge("baton_engine_cgroups", "1 while each engine runs in a cgroup that a fence kills whole",
        c.cgroups() != nullptr ? 1 : 0);
  gauge("baton_barrier_waits", "Reaped holders whose blocks wait for the fencing barrier",
        static_cast<double>(c.barrier_waits()));
  gauge("baton_invariants_ok", "1 while no fencing invariant is violated",
        c.invariants() == "ok" ? 1 : 0);
  counter("baton_engine_launches_total", "Engine processes launched",
          static_cast<double>(c.launches()));
  counter("baton_failovers_total", "Primaries lost or retired", static_cast<double>(c.failovers()));
  counter("baton_switchovers_called_off_total",
          "Switch-overs whose standby failed while the primary drained; the primary served on",
          static_cast<double>(c.called_off_switchovers()));
  counter("baton_engine_failures_total", "Engine failures seen by the crash-loop guard",
          static_cast<double>(c.guard().total_failures()));
  counter("baton_refusals_total", "Refused messages and connections",
          static_cast<double>(c.refusal_count()));
  counter("baton_controller_ticks_total",
          "Runs of the controller's housekeeping timer (deadlines, restarts, probes)",
          static_cast<double>(c.ticks()));
  gauge("baton_epoch_reserved", "Highest epoch the journal has reserved on disk",
        static_cast<double>(c.reserved_epoch()));
  gauge("baton_epoch_journal_ok", "1 while the latest write of the epoch journal succeeded",
        c.journal().last_write().ok() ? 1 : 0);
  counter("baton_epoch_journal_write_failures_total", "Failed writes of the epoch journal",
          static_cast<double>(c.journal().write_failures()));
  gauge("baton_unfenced_reaped",
        "Reaped engines whose blocks wait for a durable epoch to be fenced at",
        static_cast<double>(c.unfenced_reaped().size()));
  gauge("baton_client_send_queued_bytes",
        "Bytes the connections of batonctl and routers hold unsent together",
        static_cast<double>(c.client_send_queued_bytes()));
  if (c.cuda_backend()) {
    gauge("baton_device_lost", "1 while the device memory is lost and being rebuilt",
          c.device() == nullptr ? 1 : 0);
    counter("baton_device_losses_total", "Times the GPU was found lost",
            static_cast<double>(c.device_losses()));
    counter("baton_device_rebuilds_total", "Times the device memory was rebuilt",
            static_cast<double>(c.device_rebuilds()));
  }
  out << UpgradeMetrics(c);
  if (const PromotionRecord* r = c.timelines().last(); r != nullptr) {
    const PhaseTimes p = PhasesOf(*r);
    if (p.ready_ms.has_value()) {
      gauge("baton_last_failover_ready_ms", "Detection to route published, last promotion",
            *p.ready_ms);
    }
  }
  return out.str();
}

}  // namespace baton
