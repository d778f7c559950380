// FailoverPart: the Coordinator's part for the pair's failures: an engine fenced, its blocks
// past the barrier, the standby promoted, the promotion reserve kept full.
//
// A failover, in order:
//   detect (exit, lost connection, hang confirmed by a health probe, error report) -> Fence:
//   Kill -> new epoch made durable -> ledger fence (the old primary's blocks quarantined)
//   -> the promotion reserve granted to the standby at the new epoch (PromoteBeforeBarrier)
//   -> roster written -> Quarantined and Promote sent (SendPromote) -> PromoteAck -> route
//   table published -> replacement standby launched; and meanwhile: exit seen (OnExited ->
//   Fence, a no-op when already fenced -> OnReaped) -> barrier (PassBarrierOrWait:
//   Effects::BarrierHeldBy) -> the quarantined blocks granted to the new primary
//   (HandOverBlocks) -> the reserve refilled (RefillReserve, a Reclaim).
// EOF, exit, a confirmed hang, an error report and recovery's verdicts converge in Fence:
// whichever comes first kills the engine and fences its blocks at a durable epoch; the exit
// only adds the reaping, after which the blocks wait for the barrier. FenceHolder is the only
// caller of the ledger's Fence (for the primary, another holder, and the retries of a fence
// the journal could not make durable). Without a full reserve, or with an engine older than
// protocol 7, the promotion waits for the barrier and takes the quarantined blocks with its Promote
// (HandOverBlocks). SendPromote is the only place a Promote is sent.
//
// Files: coordinator_failover.cc (failures, fences, epochs), coordinator_promotion.cc
// (promotions and the reserve), coordinator_barrier.cc (the barrier and the hand-over).
//
// Ownership: owns FailoverFields; borrows the shared state and the other parts
// (coordinator_parts.h). Thread: the Coordinator's.
#pragma once

#include <sys/types.h>

#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "controller/core/coordinator_state.h"

namespace baton {

struct CoordinatorParts;

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

struct FailoverFields {
  std::optional<PendingFailover> failover;
  std::map<EngineId, BarrierWait> barrier_waits;  // by reaped engine
  std::map<EngineId, pid_t> unfenced_reaped;      // reaped holders without a durable epoch
  TimePoint next_unfenced_retry{};
  std::string reserve_note;            // why the pool keeps no promotion reserve ("" if it does)
  std::deque<Duration> teardowns;      // the last failovers' detected -> barrier passed
  TimePoint next_reserve_reclaim{};    // RefillReserve's next Reclaim, not before
  EngineId reserve_asked = kNoEngine;  // the primary RefillReserve asked last
  TimePoint next_promote_epoch{};      // MaybePromote's next try after a journal failure
  bool replenish_failing = false;
  TimePoint next_replenish{};
};

class FailoverPart {
 public:
  FailoverPart(CoordinatorState& s, const CoordinatorParts& p);

  const FailoverFields& own() const { return own_; }

  // --- failures (coordinator_failover.cc) ---------------------------------------------------
  // The one function that fences, whatever saw the engine fail first (a lost connection, its
  // exit, a hang, an error report, a stale epoch, a command): kills it, fences its blocks at
  // a durable epoch, and for the primary starts the failover. Nothing for an engine already
  // fenced.
  void Fence(EngineId id, FailCause cause, const std::string& detail);
  // Its process exited and was reaped: fenced if it was not yet, then its blocks go to the
  // barrier.
  void OnExited(EngineId id, const std::string& how);
  void OnDrained(EngineRecord& e, const proto::Drained& msg);
  // Keeps a batch of epochs durable ahead of the next promotion.
  void ReplenishEpochs();

  // --- promotion (coordinator_promotion.cc) -------------------------------------------------
  // Promotes the standby when there is no primary and nothing waits for a barrier.
  void MaybePromote();
  // The ready standby to promote, unless it is silent too (its heartbeats missed: hung with
  // the primary, or the host stalled): it is promoted once it answers, fenced if it never does.
  EngineRecord* Successor();
  // Blocks of a failed holder not yet past the barrier.
  bool BlocksAwaitBarrier() const;
  // The promotion reserve from the configuration, or why there is none (logged with
  // `announce`).
  void SetUpReserve(bool announce);
  // The one place a Promote is sent: `e` becomes a holder at `epoch` with `extents` (already
  // granted in the ledger); the roster is written first. `quarantined`: the blocks of the
  // predecessor that wait for its barrier (sent first, in Quarantined).
  void SendPromote(EngineRecord& e, uint64_t epoch, const std::vector<Extent>& extents,
                   const std::vector<Extent>& quarantined = {});
  void OnPromoteAck(EngineRecord& e, const proto::PromoteAck& msg);

  // --- barrier (coordinator_barrier.cc) -----------------------------------------------------
  // Asks the primary to return free blocks while the promotion reserve is short.
  void RefillReserve();
  void PollBarrierWaits();
  void RetryUnfencedHolders();

 private:
  void FailPrimary(EngineRecord& e, FailCause cause, TimePoint detected_at,
                   std::optional<TimePoint> killed_at);
  // The fence of a failed engine that is not the primary: a holder through FenceHolder, a
  // standby (it holds nothing, no epoch is spent) through the ledger's FenceStandby.
  void FenceInLedger(EngineRecord& e);
  // The one place the ledger fences a holder: a new epoch made durable, then the ledger's
  // Fence (every lease of `id` quarantined, the epoch reserved for its successor). Returns
  // that epoch, or the journal's error when none could be made durable: the holder stays
  // unfenced, tried again at its reaping (OnReaped) and then by RetryUnfencedHolders.
  Result<uint64_t> FenceHolder(EngineId id);
  // The engine's process is gone: its blocks move on once the barrier has passed.
  void OnReaped(EngineRecord& e);
  // Promotes `s` now on the promotion reserve while the old primary waits for its barrier;
  // false (and why, in the log and the timeline) when the promotion must wait.
  bool PromoteBeforeBarrier(EngineRecord& s);
  // Why a promotion of `s` cannot start before the barrier ("" when it can).
  std::string WhyPromotionWaits(const EngineRecord& s) const;
  void ClosePromotionTimeline();
  void HandOverBlocks(EngineId old, const std::optional<PendingFailover>& failover);
  // The blocks of `old`, past its barrier, to the engine promoted before it (a Grant).
  void GrantToPromoted(EngineId old, const PendingFailover& failover);
  // Frees a fenced engine's blocks past its barrier; the primary gets them on a tick.
  void ReleaseToFree(EngineId old);
  // The timeline of the failover that fenced `old`: its barrier passed now.
  void NoteBarrierPassed(EngineId old, const std::optional<PendingFailover>& failover);
  // How long the barrier of the failover of now is expected to take still, from the last
  // teardowns (detected -> barrier passed).
  Duration BarrierEstimate() const;
  void PassBarrierOrWait(BarrierWait wait);
  void FinishBarrierWait(const BarrierWait& wait, bool timed_out);
  // The engine's handles go once nothing waits on its process.
  void ReleaseIfDone(EngineId id);

  CoordinatorState& s_;
  const CoordinatorParts& p_;
  FailoverFields own_;
};

}  // namespace baton
