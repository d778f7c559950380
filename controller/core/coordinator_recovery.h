// RecoveryPart: the Coordinator's part for a restarted controller (Start with a roster). It
// rebuilds the ledger from the roster and the journal, waits `readopt_timeout` for the
// previous controller's engines to reattach, checks each (token, pid, epoch, extents, the
// memory it maps) and fences, before any block moves, every engine it cannot account for.
// While it runs nothing is launched and no free block is granted: a re-adopted primary that
// fails is replaced by the re-adopted standby with that primary's own blocks, once past
// their barrier (FailoverPart::HandOverBlocks), never on the reserve (coordinator_recovery.cc).
//
// Ownership: owns RecoveryFields; borrows the shared state and the other parts
// (coordinator_parts.h). Thread: the Coordinator's.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "controller/core/coordinator_state.h"

namespace baton {

struct CoordinatorParts;

// A restarted controller's wait for the previous controller's engines.
struct Recovery {
  TimePoint deadline;  // for the awaited to reattach; the silent are fenced then
  TimePoint exec_at;   // the process start, for readopt_ms
  Roster roster;       // what the previous controller left
  uint64_t arena_dev = 0, arena_ino = 0, pool_dev = 0, pool_ino = 0;
  std::set<EngineId> awaited;          // alive, not reattached yet
  std::map<EngineId, TimePoint> gone;  // exited, not reattached: their barrier, until then
  std::optional<InFlightUpgrade> upgrade;
  // The engine promoted before its predecessor's barrier that reattached promoted (the heir):
  // the blocks the previous controller would have granted it, by the roster engine that may
  // still map them (the heir itself for a Grant it never received), granted to it once that
  // engine is gone and past its barrier (GrantInheritance).
  struct Inheritance {
    EngineId heir = kNoEngine;
    uint64_t epoch = 0;
    std::map<EngineId, std::vector<Extent>> from;
    bool granted = false;  // some of the old primary's came in a Grant
  };
  std::optional<Inheritance> inheritance;
  RecoveryStatus status;
};

struct RecoveryFields {
  std::optional<Recovery> recovery;  // while it runs
  RecoveryStatus last;               // kept for status once recovery ends
};

class RecoveryPart {
 public:
  RecoveryPart(CoordinatorState& s, const CoordinatorParts& p);

  const RecoveryFields& own() const { return own_; }
  bool active() const { return own_.recovery.has_value(); }
  // Whether `id` is the canary of the upgrade the restart interrupted, re-adopted while the
  // recovery waits for the others: its PromoteAck waits for the upgrade to resume (the
  // upgrade, not a failover, promoted it; the old primary may not be back yet).
  bool HoldsCanary(EngineId id) const {
    return own_.recovery.has_value() && own_.recovery->upgrade.has_value() &&
           own_.recovery->upgrade->canary == id && own_.recovery->roster.primary != id;
  }
  // Whether `id` is the previous controller's primary, not re-adopted (yet): losing it is the
  // pair's failover (LosePreviousPrimary), not a standby's death.
  bool IsLostPrimary(EngineId id) const {
    return own_.recovery.has_value() && own_.recovery->roster.primary == id && s_.primary != id;
  }
  // What status shows: the recovery in progress, or the last one.
  const RecoveryStatus& status() const {
    return own_.recovery.has_value() ? own_.recovery->status : own_.last;
  }

  // Start with the previous controller's roster: its engines are awaited.
  void BeginRecovery(const StartState& found);
  // A start without a previous controller's engines: what status says of it.
  void NoteFreshStart(const StartState& found);
  void OnReattach(EngineRecord& e, const proto::Reattach& msg);
  // Whether an adopted engine may Register (it had not registered with the previous
  // controller); otherwise it is fenced and false.
  bool AcceptRegister(EngineRecord& e);
  // An adopted engine that never reattached is gone: its blocks wait for its barrier.
  void NoteGone(EngineRecord& e, const std::string& how);
  // The silent fenced at the deadline, the gone past their barrier; ends the recovery when
  // nothing is left to wait for.
  void TickRecovery();

 private:
  void AdoptRosterEngine(const RosterEngine& r, bool alive, const StartState& found);
  // A roster engine that cannot be re-adopted: fenced (killed), its exit awaited.
  void FenceUnaccounted(EngineRecord& e, const std::string& why);
  // The previous controller's primary `e` is gone or unaccounted for: a failover opens, or,
  // for a pair `batonctl drain` took out of service, its drain ends (the pair is stopped).
  void LosePreviousPrimary(const EngineRecord& e, const std::string& why);
  // Why `msg` cannot be accounted for by the roster entry of `e` ("" if it can).
  std::string CheckReattach(const EngineRecord& e, const proto::Reattach& msg) const;
  // Re-adopts `e` as `msg` says, checked by CheckReattach: the steps below, then the roster
  // saved, the recovery ticked and the routes published.
  void Readopt(EngineRecord& e, const proto::Reattach& msg);
  // Takes `e`'s blocks back into the ledger and answers ReattachAck; false (fenced, or its
  // channel failed) if that could not be done.
  bool AcknowledgeReattach(EngineRecord& e, const proto::Reattach& msg);
  // Steps `e` and the pair to where `role` says `e` is; the roster's primary (or the engine
  // promoted to it) serving is the primary again.
  void StepReadopted(EngineRecord& e, proto::ReattachRole role);
  // `e` reattached promoted, in a failover before the old primary's barrier: the blocks the
  // previous controller would have granted it after that barrier (the old primary's, as the
  // roster has them, and a Grant it wrote but `e` did not claim) are owed to it.
  void NoteInheritance(const EngineRecord& e, const proto::Reattach& msg);
  // The owed blocks whose holder is gone and past its barrier, granted to the heir at its
  // epoch; dropped (freed at the recovery's end) if the heir is gone or no longer holds it.
  // A heir owed nothing it could be granted is told at once (an empty Quarantined), so that
  // it stops waiting for the quarantined blocks and replays their KV.
  void GrantInheritance();
  // Grants `heir` what of `ready` is still unclaimed; whether a Grant was sent.
  bool GrantOwed(EngineRecord& heir, const std::vector<Extent>& ready);
  // An engine that drained to its end while no controller ran: fenced, counted gone.
  void RetireDrained(EngineRecord& e);
  // An engine that was draining: its drain goes on, or is called off (ResumeEngine).
  void GoOnDraining(EngineRecord& e);
  void EndRecovery();

  CoordinatorState& s_;
  const CoordinatorParts& p_;
  RecoveryFields own_;
};

}  // namespace baton
