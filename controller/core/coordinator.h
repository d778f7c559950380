// Coordinator: every decision of the controller, and nothing else. It takes events (an
// engine connected, a message, a lost connection, an exit, a timer, an operator's command,
// the controller's start with what it found) and acts only through its Effects (kill, send a
// grant or a promotion, publish routes, write the roster or the command record, launch) and
// its EpochStore (the journal). It does no I/O of its own: the daemon (controller/controller.h)
// turns sockets, pidfds and timers into events and carries out the effects on real processes;
// the randomized simulation (tests/controller/simulation_test.cc) drives this same class
// against a model of the world, so what the simulation proves is what runs.
//
// Failover, in order (coordinator_failover.cc, coordinator_barrier.cc):
//   detect (exit, lost connection, hang confirmed by a health probe, error report)
//   -> Kill -> new epoch made durable -> ledger fence (the old primary's blocks quarantined)
//   -> the promotion reserve granted to the standby at the new epoch -> roster written
//   -> Quarantined (the old blocks, read-only) and Promote sent (SendPromote, the only place
//   that sends one) -> PromoteAck -> route table published -> replacement standby launched;
//   and meanwhile: exit seen -> barrier (Effects::BarrierHeldBy: the process group and cgroup
//   empty, NVML no longer listing it) -> the quarantined blocks granted to the new primary
//   -> the reserve refilled (a Reclaim). Without a full reserve (a pool too small for one, one
//   used by a promotion whose barrier has not passed) or with an engine older than protocol
//   7, the promotion waits for the barrier and takes the quarantined blocks with its Promote.
// No block is granted before its old holder is reaped and past the barrier (rule 2); every
// grant's epoch is durable before it is sent (rule 3); the standby maps nothing writable
// until Promote (rule 5); a stale epoch is refused, the sender told to stop and fenced (rule 4).
//
// A restarted controller (Start with a roster) rebuilds the ledger from the roster and the
// journal, waits `readopt_timeout` for the previous controller's engines to reattach, checks
// each (token, pid, epoch, extents, the memory it maps) and fences, before any block moves,
// every engine it cannot account for (coordinator_recovery.cc).
//
// The pair and engine state machines are the state. A transition the tables refuse is a bug:
// it is logged, counted (CoordinatorStatus::refused_transitions, the metric
// baton_refused_transitions_total) and fails every test that checks the status.
//
// Thread: one (the controller's io_context thread, or the simulation's); never blocks but in
// its Effects and EpochStore. The Clock, EpochStore and Effects must outlive it.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "base/clock.h"
#include "base/status.h"
#include "controller/config.h"
#include "controller/core/coordinator_state.h"
#include "controller/core/coordinator_status.h"
#include "controller/core/crash_loop_guard.h"
#include "controller/core/effects.h"
#include "controller/core/engine_record.h"
#include "controller/core/epoch_journal.h"
#include "controller/core/pair_state.h"
#include "controller/core/pool_ledger.h"
#include "controller/core/roster.h"
#include "controller/promotion.h"
#include "controller/upgrade/command_record.h"
#include "controller/upgrade/upgrade.h"

namespace baton {

// What an engine sends, decoded.
using FromEngine =
    std::variant<proto::Register, proto::Reattach, proto::StandbyReady, proto::Heartbeat,
                 proto::LeaseRequest, proto::ReturnExtents, proto::ErrorReport, proto::PromoteAck,
                 proto::Drained, proto::ShareMemoryAck, proto::ErrorMsg, proto::KvAdopted,
                 proto::KvInherited>;

class Coordinator {
 public:
  Coordinator(const ControllerConfig& config, const Clock& clock, EpochStore& epochs,
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
  // Its process exited and was reaped (or, adopted, seen gone); `how` for the log.
  void OnExited(EngineId id, const std::string& how);
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
  bool recovering() const { return recovery_.has_value(); }
  uint64_t refused_transitions() const { return s_.refused_transitions; }
  const std::string& invariants() const { return s_.invariants; }

  // --- tests ----------------------------------------------------------------------------------
  // A deliberate ledger fault (PoolLedger::Mutation), kept when a restart rebuilds the ledger:
  // for the simulation's tests that prove its checks catch one. Call before Start.
  void SetLedgerMutationForTesting(PoolLedger::Mutation mutation);

 private:
  // A fenced primary whose blocks go to `successor` once it is past the barrier: with its
  // Promote, or, when it was promoted at once on the reserve (`promoted`), in a Grant.
  struct PendingFailover {
    EngineId old = kNoEngine;
    uint64_t epoch = 0;
    EngineId successor = kNoEngine;
    bool promoted = false;
  };
  // A reaped holder whose blocks wait for the rest of the barrier (its group, its cgroup,
  // NVML), until `deadline`.
  struct BarrierWait {
    EngineId old = kNoEngine;
    pid_t pid = 0;
    std::optional<PendingFailover> failover;
    TimePoint deadline;
  };
  // A restarted controller's wait for the previous controller's engines.
  struct Recovery {
    TimePoint deadline;  // for the awaited to reattach; the silent are fenced then
    TimePoint exec_at;   // the process start, for readopt_ms
    Roster roster;       // what the previous controller left
    uint64_t arena_dev = 0, arena_ino = 0, pool_dev = 0, pool_ino = 0;
    std::set<EngineId> awaited;          // alive, not reattached yet
    std::map<EngineId, TimePoint> gone;  // exited, not reattached: their barrier, until then
    std::optional<InFlightUpgrade> upgrade;
    RecoveryStatus status;
  };

  // coordinator.cc: the roster.
  bool IsCanary(EngineId id) const { return upgrade_.has_value() && upgrade_->canary == id; }
  Roster MakeRoster() const;
  void SaveRoster();

  // coordinator_engines.cc: launching and engine messages.
  std::optional<TimePoint> NextLaunchAt() const;
  void MaybeLaunch();
  void Launch(proto::LaunchRole role);
  int PickPort() const;
  void OnRegister(EngineRecord& e, const proto::Register& reg);
  void OnStandbyReady(EngineRecord& e, const proto::StandbyReady& msg);
  void OnShareMemoryAck(EngineRecord& e, const proto::ShareMemoryAck& msg);
  bool CheckEpoch(EngineRecord& e, uint64_t epoch, const char* what);
  void OnHeartbeat(EngineRecord& e, const proto::Heartbeat& msg);
  void OnLeaseRequest(EngineRecord& e, const proto::LeaseRequest& msg);
  void OnReturn(EngineRecord& e, const proto::ReturnExtents& msg);
  void RefuseEngine(EngineRecord& e, const Status& status);
  // Tells `e` to stop with `why`, records the refusal and fences it as kMisbehaved.
  void StopAndFence(EngineRecord& e, FailCause cause, const std::string& why);
  void StartDetector(EngineRecord& e);

  // coordinator_failover.cc: failures, fences, promotions.
  void Fail(EngineId id, FailCause cause, const std::string& detail);
  void FailPrimary(EngineRecord& e, FailCause cause, TimePoint detected_at,
                   std::optional<TimePoint> killed_at);
  void FenceInLedger(EngineRecord& e);
  void FinishFence(EngineRecord& e);
  bool BlocksAwaitBarrier() const;
  void MaybePromote();
  // Promotes `s` now on the promotion reserve while `failover_`'s old primary waits for its
  // barrier; false (and why, in the log and the timeline) when the promotion must wait.
  bool PromoteBeforeBarrier(EngineRecord& s);
  // Why a promotion of `s` cannot start before the barrier ("" when it can).
  std::string WhyPromotionWaits(const EngineRecord& s) const;
  // The promotion reserve from the configuration, or why there is none (logged with
  // `announce`).
  void SetUpReserve(bool announce);
  // The one place a Promote is sent: `e` becomes a holder at `epoch` with `extents` (already
  // granted in the ledger); the roster is written first. `quarantined`: the blocks of the
  // predecessor that wait for its barrier (sent first, in Quarantined).
  void SendPromote(EngineRecord& e, uint64_t epoch, const std::vector<Extent>& extents,
                   const std::vector<Extent>& quarantined = {});
  void OnPromoteAck(EngineRecord& e, const proto::PromoteAck& msg);
  void OnDrained(EngineRecord& e, const proto::Drained& msg);
  // What a promoted engine adopted of its predecessor's KV: into the promotion's timeline.
  void OnKvAdopted(EngineRecord& e, const proto::KvAdopted& msg);
  // How it took the KV of its predecessor's quarantined blocks: into the timeline.
  void OnKvInherited(EngineRecord& e, const proto::KvInherited& msg);
  void ClosePromotionTimeline();

  // coordinator_barrier.cc: when a fenced holder's blocks move on.
  void HandOverBlocks(EngineId old, const std::optional<PendingFailover>& failover);
  // The blocks of `old`, past its barrier, to the engine promoted before it (a Grant).
  void GrantToPromoted(EngineId old, const PendingFailover& failover);
  // The timeline of the failover that fenced `old`: its barrier passed now.
  void NoteBarrierPassed(EngineId old, const std::optional<PendingFailover>& failover);
  // How long the barrier of the failover of now is expected to take still, from the last
  // teardowns (detected -> barrier passed).
  Duration BarrierEstimate() const;
  // Asks the primary to return free blocks while the promotion reserve is short.
  void RefillReserve();
  void PassBarrierOrWait(BarrierWait wait);
  void PollBarrierWaits();
  void FinishBarrierWait(const BarrierWait& wait, bool timed_out);
  void RetryUnfencedHolders();
  // The engine's handles go once nothing waits on its process.
  void ReleaseIfDone(EngineId id);

  // coordinator_ops.cc: commands, periodic checks, routes, epochs.
  void CallOffSwitchover(EngineRecord& standby);
  Status CheckNoCalledOffDrain(const EngineRecord& primary) const;
  void DrainEngine(EngineRecord& e);
  // Sends Resume to a draining `e` that speaks a protocol that has it; false otherwise.
  bool ResumeEngine(EngineRecord& e);
  PromotionRecord& OpenPlannedTimeline(PromotionKind kind, const std::string& cause,
                                       const EngineRecord& old, EngineId next);
  void GrantFree(EngineRecord& e, uint32_t blocks, const char* who);
  // Sends to `e`; a send that fails fences it (`what` names the message in the reason).
  bool SendOrFail(EngineRecord& e, const ToEngine& message);
  void PollEngines();
  void PublishRoutes();
  void ReplenishEpochs();
  void CheckDevice();
  void RebuildDevice();

  // coordinator_upgrade.cc: the canary upgrade.
  std::vector<std::string> CommandFor(EngineId id, proto::LaunchRole role);
  void SetPhase(Upgrade::Phase phase);
  void StartCanary(EngineRecord& e);
  void OnPrimaryReturned();
  void PromoteCanary();
  void OnCanaryPromoted(EngineRecord& e, uint64_t epoch);
  void TickUpgrade();
  void TickCanary();
  void FinishUpgrade();
  void RollBackCanary(const std::string& reason);
  void OnCanaryGone(EngineRecord& e);
  bool CanaryTakesOver(EngineRecord& old);
  void EndUpgrade(UpgradeOutcome outcome, const std::string& reason);
  // The promotion reserve is counted in the canary's share until the upgrade ends.
  void LendReserveToCanary();
  uint32_t CanaryTarget(uint32_t weight) const;
  uint32_t PrimaryKeeps() const;
  void ReclaimFromPrimary(uint32_t weight);
  void GrantFreeToCanary();
  void GiveFreeBlocksToPrimary();
  void RetireStaleStandbys();
  const std::vector<std::string>& active_command() const;
  void LoadCommands(const StartState& found);
  void SaveCommands();
  // An upgrade in flight that a restart ended: recorded as rolled back with `reason`.
  void RecordInterruptedUpgrade(const InFlightUpgrade& u, const std::string& reason);

  // coordinator_recovery.cc: a restarted controller re-adopts what it can prove.
  void BeginRecovery(const StartState& found);
  void AdoptRosterEngine(const RosterEngine& r, bool alive, const StartState& found);
  // A roster engine that cannot be re-adopted: fenced (killed), its exit awaited.
  void FenceUnaccounted(EngineRecord& e, const std::string& why);
  // An adopted engine that never reattached is gone: its blocks wait for its barrier.
  void NoteGone(EngineRecord& e, const std::string& how);
  void OnReattach(EngineRecord& e, const proto::Reattach& msg);
  // Why `msg` cannot be accounted for by the roster entry of `e` ("" if it can).
  std::string CheckReattach(const EngineRecord& e, const proto::Reattach& msg) const;
  void Readopt(EngineRecord& e, const proto::Reattach& msg);
  void ResumeUpgrade(const InFlightUpgrade& in_flight);
  void TickRecovery();
  void EndRecovery();

  // coordinator_status.cc
  EngineStatus EngineStatusOf(const EngineRecord& e) const;
  proto::EngineRole RoleOf(const EngineRecord& e) const;

  CoordinatorState s_;  // shared by every part (coordinator_state.h)
  std::optional<PendingFailover> failover_;
  std::map<EngineId, BarrierWait> barrier_waits_;  // by reaped engine
  std::map<EngineId, pid_t> unfenced_reaped_;      // reaped holders without a durable epoch
  TimePoint next_unfenced_retry_{};
  std::optional<Upgrade> upgrade_;
  std::deque<UpgradeResult> upgrade_history_;
  std::vector<std::string> active_command_;    // empty: config_.engine_command
  std::vector<std::string> previous_command_;  // what the last promoted upgrade replaced
  uint64_t upgrades_promoted_ = 0;
  uint64_t upgrades_rolled_back_ = 0;
  bool give_back_blocks_ = false;       // a canary is gone: free blocks return to the primary
  std::string reserve_note_;            // why the pool keeps no promotion reserve ("" if it does)
  std::deque<Duration> teardowns_;      // the last failovers' detected -> barrier passed
  TimePoint next_reserve_reclaim_{};    // RefillReserve's next Reclaim, not before
  EngineId reserve_asked_ = kNoEngine;  // the primary RefillReserve asked last
  std::optional<Recovery> recovery_;
  RecoveryStatus last_recovery_;  // kept for status once recovery ends

  TimePoint next_device_probe_{};
  uint64_t device_losses_ = 0;
  uint64_t device_rebuilds_ = 0;
  std::string device_lost_reason_;
  std::string rebuild_error_;
  uint64_t rebuild_failures_ = 0;

  bool replenish_failing_ = false;
  TimePoint next_replenish_{};
  TimePoint next_promote_epoch_{};
};

}  // namespace baton
