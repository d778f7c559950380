// Coordinator: every decision of the controller, and nothing else. It takes events (an
// engine connected, a message, a lost connection, an exit, a timer, an operator's command,
// the controller's start with what it found) and acts only through its Effects (kill, send a
// grant or a promotion, publish routes, write the roster or the command record, launch) and
// its EpochStore (the journal). It does no I/O of its own: the daemon (controller/controller.h)
// turns sockets, pidfds and timers into events and carries out the effects on real processes;
// the randomized simulation (tests/controller/simulation_test.cc) drives this same class
// against a model of the world, so what the simulation proves is what runs.
//
// The map. The Coordinator routes each event to the parts it concerns and holds no decision
// of its own (coordinator.cc). The parts (coordinator_parts.h), one class per concern, each
// owning its fields and sharing one CoordinatorState (coordinator_state.h: the pair and engine
// machines, the engine records, the ledger, the epoch store, the timelines) and one Effects:
//   EnginePart    launching, engine messages, the roster, the route table, the engines'
//                 deadlines and heartbeats (coordinator_engines.h: coordinator_engines.cc,
//                 coordinator_roster.cc)
//   FailoverPart  the pair's failures: the fence, the barrier, the promotion, the promotion
//                 reserve (coordinator_failover.h: coordinator_failover.cc,
//                 coordinator_promotion.cc, coordinator_barrier.cc)
//   RecoveryPart  a restarted controller re-adopting what it can prove
//                 (coordinator_recovery.h: coordinator_recovery.cc)
//   UpgradePart   upgrades by canary and the engine command record (coordinator_upgrade.h:
//                 coordinator_upgrade.cc, coordinator_upgrade_record.cc)
//   DevicePart    the CUDA device: probed, lost, rebuilt (coordinator_device.h:
//                 coordinator_device.cc)
//   CommandPart   switch-over, drain, resume, drill (coordinator_commands.h:
//                 coordinator_commands.cc)
// Snapshot() gathers them for status (coordinator_status.cc).
//
// Failover, in order (FailoverPart, coordinator_failover.h has the detail):
//   detect (exit, lost connection, hang confirmed by a health probe, error report) -> Fence:
//   Kill -> new epoch made durable -> ledger fence (the old primary's blocks quarantined)
//   -> the promotion reserve granted to the standby at the new epoch -> roster written
//   -> Quarantined (the old blocks, read-only) and Promote sent (SendPromote, the only place
//   that sends one) -> PromoteAck -> route table published -> replacement standby launched;
//   and meanwhile: exit seen -> barrier (Effects::BarrierHeldBy: the process group and cgroup
//   empty, NVML no longer listing it) -> the quarantined blocks granted to the new primary
//   -> the reserve refilled (a Reclaim). Without a full reserve (a pool too small for one, one
//   used by a promotion whose barrier has not passed) or with an engine older than protocol
//   7, the promotion waits for the barrier and takes the quarantined blocks with its Promote.
//   A lost connection and an exit both enter FailoverPart::Fence, the one function that
//   fences; whichever comes second finds the engine fenced already.
// No block is granted before its old holder is reaped and past the barrier, or the barrier's
// gpu_release_timeout has passed with an error logged (rule 2); every grant's epoch is
// durable before it is sent (rule 3); the standby maps nothing writable until Promote (rule
// 5); a stale epoch is refused, the sender told to stop and fenced (rule 4).
//
// A restarted controller (Start with a roster) rebuilds the ledger from the roster and the
// journal, waits `readopt_timeout` for the previous controller's engines to reattach, checks
// each (token, pid, epoch, extents, the memory it maps) and fences, before any block moves,
// every engine it cannot account for (RecoveryPart).
//
// The pair and engine state machines are the state. A transition the tables refuse is a bug:
// it is logged, counted (CoordinatorStatus::refused_transitions, the metric
// baton_refused_transitions_total) and fails every test that checks the status.
//
// Thread: one (the controller's io_context thread, or the simulation's); never blocks but in
// its Effects and EpochStore. The Clock, EpochStore and Effects must outlive it.
#pragma once

#include <string>
#include <variant>
#include <vector>

#include "base/clock.h"
#include "base/status.h"
#include "controller/core/command_record.h"
#include "controller/core/coordinator_config.h"
#include "controller/core/coordinator_mutation.h"
#include "controller/core/coordinator_parts.h"
#include "controller/core/coordinator_state.h"
#include "controller/core/coordinator_status.h"
#include "controller/core/crash_loop_guard.h"
#include "controller/core/effects.h"
#include "controller/core/engine_record.h"
#include "controller/core/epoch_store.h"
#include "controller/core/pair_state.h"
#include "controller/core/pool_ledger.h"
#include "controller/core/promotion.h"
#include "controller/core/roster.h"
#include "controller/core/upgrade.h"

namespace baton {

// What an engine sends, decoded.
using FromEngine =
    std::variant<proto::Register, proto::Reattach, proto::StandbyReady, proto::Heartbeat,
                 proto::LeaseRequest, proto::ReturnExtents, proto::ErrorReport, proto::PromoteAck,
                 proto::Drained, proto::ShareMemoryAck, proto::ErrorMsg, proto::KvAdopted,
                 proto::KvInherited, proto::Progress>;

class Coordinator {
 public:
  Coordinator(const CoordinatorConfig& config, const Clock& clock, EpochStore& epochs,
              Effects& effects);
  ~Coordinator();
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // --- events -----------------------------------------------------------------------------
  // The controller starts: fresh, or after a previous one with what it left. Launches the
  // pair, or waits for the previous engines to reattach.
  void Start(const StartState& found);
  // The engine whose launch token is `token` may connect (Hello): its id, or why not.
  Result<EngineId> Admit(const std::string& token) const;
  // Its Hello was accepted: messages from it follow.
  void OnConnected(EngineId id, uint16_t protocol);
  void OnMessage(EngineId id, const FromEngine& message);
  // A message that did not decode: the engine is fenced.
  void OnBadMessage(EngineId id, const std::string& what);
  // A message of a type an engine never sends: refused (ErrorMsg), the engine stays.
  void OnUnexpectedMessage(EngineId id, const std::string& type);
  // The daemon refused a connection (a bad Hello, a stranger's token): kept for status.
  void NoteRefusal(const std::string& who, const std::string& reason) { s_.Refused(who, reason); }
  // Its connection closed (`error`: not a clean close).
  void OnDisconnected(EngineId id, const std::string& reason, bool error);
  // Its process is exiting: a thread of it died holding its liveness page, before the
  // process's teardown (proto/transport/liveness_page.h). Fenced as a death, at once.
  void OnDying(EngineId id, const std::string& how);
  // Its process exited and was reaped (or, adopted, seen gone); `how` for the log.
  void OnExited(EngineId id, const std::string& how);
  // A router found it stalled: no byte on any of its answering streams for the router's
  // stall timeout (proto::EngineStalled), while its heartbeats may go on. The primary, or a
  // canary, is fenced as hung (killed; a failover, or the canary's rollback); any other
  // engine (a standby serves no stream, a fenced one is gone) is left alone.
  void OnEngineStalled(EngineId id, const std::string& detail);
  // Time passed: deadlines, heartbeats, barriers, retries, the canary.
  void OnTick();
  // When OnTick can next change something (the daemon arms its timer for it).
  TimePoint NextWakeup() const;

  // --- operator commands (batonctl): OK, or why not -----------------------------------------
  Status RequestSwitchover();
  Status RequestDrain();
  // Undoes RequestDrain: while the primary drains, the drain is called off (Resume) and it
  // serves on; once the pair is stopped, a new pair is launched.
  Status RequestResume();
  Status Drill(DrillKind kind);
  Status RequestUpgrade(UpgradeRequest request);
  Status RequestRollback(UpgradeRequest overrides = {});
  // Whether `command` could be launched here, as RequestUpgrade checks it before the standby
  // makes way (Effects::CheckCommand); `batonctl fleet upgrade` checks it before any node does.
  Status CheckCommand(const std::vector<std::string>& command) {
    return s_.effects.CheckCommand(command);
  }
  // Shutdown: every engine is told to stop (or terminated); their exits are then only
  // recorded. A clean stop fences nothing and spends no epoch.
  void BeginShutdown();
  bool stopping() const { return s_.stopping; }
  // Engines not reaped yet (the daemon's shutdown waits for them).
  std::vector<EngineId> Remaining() const;

  // --- reads --------------------------------------------------------------------------------
  // Everything `batonctl status` and /metrics show, as one copy.
  CoordinatorStatus Snapshot() const;
  const PoolLedger& ledger() const { return *s_.ledger; }
  // nullptr when unknown.
  const EngineRecord* engine(EngineId id) const;
  EngineId primary() const { return s_.primary; }
  PairState pair_state() const { return s_.pair.state(); }
  bool recovering() const { return recovery_.active(); }
  uint64_t refused_transitions() const { return s_.refused_transitions; }
  // OK, or the first violation of the ledger's invariants.
  const Status& invariants() const { return s_.invariants; }

  // --- tests ----------------------------------------------------------------------------------
  // A deliberate ledger fault (PoolLedger::Mutation), kept when a restart rebuilds the ledger:
  // for the simulation's tests that prove its checks catch one. Call before Start.
  void SetLedgerMutationForTesting(PoolLedger::Mutation mutation);
  // A deliberate fault in one of the parts (coordinator_mutation.h), for the same tests.
  void SetMutationForTesting(CoordinatorMutation mutation) { s_.mutation = mutation; }

 private:
  CoordinatorState s_;  // shared by every part (coordinator_state.h)
  CoordinatorParts parts_;
  EnginePart engines_;
  FailoverPart failover_;
  RecoveryPart recovery_;
  UpgradePart upgrades_;
  DevicePart device_;
  CommandPart commands_;
};

}  // namespace baton
