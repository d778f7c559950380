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
  // Tells `e` to drain, by drain_timeout.
  void DrainEngine(EngineRecord& e);
  // Sends Resume to a draining `e` that speaks a protocol that has it; false otherwise.
  bool ResumeEngine(EngineRecord& e);
  PromotionRecord& OpenPlannedTimeline(PromotionKind kind, const std::string& cause,
                                       const EngineRecord& old, EngineId next);

 private:
  CoordinatorState& s_;
  const CoordinatorParts& p_;
};

}  // namespace baton
