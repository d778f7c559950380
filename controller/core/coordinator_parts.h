// CoordinatorParts: the parts of the Coordinator, by concern, each a class that owns its
// fields and reaches the others through this table:
//
//   EnginePart    launching engines, their messages, the roster and the route table
//                 (coordinator_engines.h)
//   FailoverPart  the pair's failures: fence, barrier, promotion, the promotion reserve
//                 (coordinator_failover.h)
//   RecoveryPart  a restarted controller re-adopting its engines (coordinator_recovery.h)
//   UpgradePart   engine-version upgrades by canary, and the engine command record
//                 (coordinator_upgrade.h)
//   DevicePart    the CUDA backend's device: lost, fenced, rebuilt (coordinator_device.h)
//   CommandPart   the operator's commands on the pair: switch-over, drain, resume, drill
//                 (coordinator_commands.h)
//
// They share one CoordinatorState (coordinator_state.h) and one Effects. The Coordinator
// (coordinator.h) owns them all and routes each event to the parts it concerns.
//
// Ownership: the pointers are the Coordinator's members, set at its construction and valid
// for its life. Thread: the Coordinator's.
#pragma once

#include "controller/core/coordinator_commands.h"
#include "controller/core/coordinator_device.h"
#include "controller/core/coordinator_engines.h"
#include "controller/core/coordinator_failover.h"
#include "controller/core/coordinator_recovery.h"
#include "controller/core/coordinator_upgrade.h"

namespace baton {

struct CoordinatorParts {
  EnginePart* engines = nullptr;
  FailoverPart* failover = nullptr;
  RecoveryPart* recovery = nullptr;
  UpgradePart* upgrades = nullptr;
  DevicePart* device = nullptr;
  CommandPart* commands = nullptr;
};

}  // namespace baton
