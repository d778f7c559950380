// CoordinatorMutation: deliberate faults in the Coordinator's parts (coordinator_parts.h), one
// per part, each a plausible mistake, for the simulation's tests that prove its checks catch
// them (tests/controller/simulation_test.cc, SimulationMutants), as PoolLedger::Mutation does
// for the ledger. Set only by Coordinator::SetMutationForTesting, which no configuration key
// or command line reaches; kNone (the default) changes nothing, and each fault is one
// comparison at the point where it acts.
//
// Plain enum; no state.
#pragma once

namespace baton {

enum class CoordinatorMutation {
  kNone,
  // EnginePart::CheckEpoch lets any message at epoch 0 through, not only one from an engine
  // whose Promote is in flight: a serving primary's replayed standby message is acted on
  // (rule 4).
  kAcceptEpochZero,
  // FailoverPart::PromoteBeforeBarrier promotes the standby at the failed primary's epoch,
  // not at the new one its fence made durable (rule 3; the ledger refuses it: a BATON_BUG).
  kPromoteAtOldEpoch,
  // RecoveryPart::TickRecovery lets the re-adoption deadline pass without fencing the engines
  // that did not reattach: their blocks are freed while they may still write them (rule 1).
  kSpareSilentEngines,
  // UpgradePart::RollBackCanary ends the upgrade without draining and retiring a serving
  // canary: the rolled-back version goes on serving beside the primary.
  kRollbackKeepsCanary,
  // DevicePart::CheckDevice drops and rebuilds a lost device's memory without fencing the
  // engines that imported it, trusting each to report the error itself.
  kDeviceLossFencesNothing,
  // CommandPart::RequestDrain drains the primary and leaves the standby running.
  kDrainSparesStandby,
};

}  // namespace baton
