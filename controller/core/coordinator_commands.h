// CommandPart: the Coordinator's part for the operator's commands on the pair (batonctl):
// a switch-over (the primary drained, then the standby promoted), a drain of the pair and its
// undoing (resume), a drill (a fault injected into the primary); and the drains they and the
// upgrades start, and call off (coordinator_commands.cc).
//
// Ownership: owns no fields (a drill's record is shared: the failover's timeline names it);
// borrows the shared state and the other parts (coordinator_parts.h). Thread: the
// Coordinator's.
#pragma once

#include <string>

#include "controller/core/coordinator_state.h"

namespace baton {

struct CoordinatorParts;

class CommandPart {
 public:
  CommandPart(CoordinatorState& s, const CoordinatorParts& p);

  Status RequestSwitchover();
  Status RequestDrain();
  Status RequestResume();
  Status Drill(DrillKind kind);

  // The standby failed during a switch-over: the primary's drain is called off if it can be.
  void CallOffSwitchover(EngineRecord& standby);
  // Unavailable while `primary` still answers a drain that was called off.
  Status CheckNoCalledOffDrain(const EngineRecord& primary) const;
  // The pair was taken out of service (`batonctl drain`) before this controller started, and
  // its roster says so: the drain goes on. The pair is made draining (its primary drained, a
  // FinalDrain, if it serves still) or stopped, any other engine re-adopted is fenced, and no
  // engine is launched until `batonctl resume`.
  void KeepDrained();
  // Tells `e` to drain, by drain_timeout. `successor`: an engine follows it that serves its
  // requests (a switch-over's standby, an upgrade's canary or, for a canary rolled back, the
  // primary), so it may hand them over (Drain); without one (`batonctl drain`) it is told to
  // finish them (FinalDrain, protocol 9; an older engine is sent Drain, and a warning logged).
  void DrainEngine(EngineRecord& e, bool successor);
  // Sends Resume to a draining `e` that speaks a protocol that has it; false otherwise.
  bool ResumeEngine(EngineRecord& e);
  PromotionRecord& OpenPlannedTimeline(PromotionKind kind, const std::string& cause,
                                       const EngineRecord& old, EngineId next);

 private:
  // Fences every live engine but the primary and drains the primary (no successor) unless it
  // drains already; the pair has taken kDrain.
  void TakeOutOfService();

  CoordinatorState& s_;
  const CoordinatorParts& p_;
};

}  // namespace baton
