// UpgradePart: the operator's `batonctl upgrade` and `batonctl rollback`
// (controller/core/coordinator_upgrade.h). An upgrade starts beside a serving primary, whose
// standby (ready, or failing to start) makes way for the canary; with no engine serving, the
// command is switched at once, as there is nothing to judge a canary against.
#include <utility>

#include "base/log.h"
#include "controller/core/coordinator_parts.h"

namespace baton {

namespace {

constexpr const char* kLog = "upgrade";

bool Down(PairState state) { return state == PairState::kDown || state == PairState::kDownBackoff; }

// Whether no engine serves or may serve: every live one is launching, registering or a
// standby never promoted (one re-adopting after a restart may serve, a canary among them).
bool NoEngineMayServe(const CoordinatorState& s) {
  if (!Down(s.pair.state()) || s.promoting != kNoEngine) return false;
  for (const auto& [id, e] : s.engines) {
    if (e->live() && !e->is(EngineState::kLaunching) && !e->is(EngineState::kRegistering) &&
        !e->is(EngineState::kStandby)) {
      return false;
    }
  }
  return true;
}

}  // namespace

Status UpgradePart::RequestUpgrade(UpgradeRequest request) {
  return StartUpgrade(std::move(request), UpgradeKind::kUpgrade);
}

Status UpgradePart::StartUpgrade(UpgradeRequest request, UpgradeKind kind) {
  if (s_.stopping) return Unavailable("the controller is shutting down");
  if (own_.upgrade.has_value()) {
    return FailedPrecondition(std::string("an upgrade is already in progress (phase ") +
                              ToString(own_.upgrade->phase) + "); roll it back or let it finish");
  }
  if (request.command.empty()) return InvalidArgument("upgrade: no engine command given");
  if (NoEngineMayServe(s_) && !p_.recovery->active()) {
    return SwitchCommandNow(std::move(request.command), kind);
  }
  BATON_RETURN_IF_ERROR(CheckPairTakesCanary());
  BATON_RETURN_IF_ERROR(p_.commands->CheckNoCalledOffDrain(*s_.Find(s_.primary)));
  // A canary that cannot start would cost the pair its standby for nothing.
  BATON_RETURN_IF_ERROR(s_.effects.CheckCommand(request.command));
  if (const uint32_t chunk = s_.ledger->blocks_per_chunk();
      (s_.config.block_count - PrimaryKeeps(s_.config)) / chunk == 0) {
    // Engines map the device pool by whole chunks: the canary needs one of its own.
    return FailedPrecondition(
        "the device pool is " + std::to_string(s_.config.block_count) + " blocks in chunks of " +
        std::to_string(chunk) + ": a canary needs a chunk of its own while the primary keeps " +
        std::to_string(PrimaryKeeps(s_.config)) + " blocks; make gpu.pool_chunk_bytes smaller");
  }
  Upgrade u;
  u.kind = kind;
  u.policy = s_.config.canary;
  if (request.steps.has_value()) u.policy.steps = *request.steps;
  if (request.step_duration.has_value()) u.policy.step_duration = *request.step_duration;
  if (request.min_requests.has_value()) u.policy.min_requests = *request.min_requests;
  BATON_RETURN_IF_ERROR(ValidateCanaryPolicy(u.policy));
  u.command = std::move(request.command);
  u.previous = active_command();
  u.primary = s_.primary;
  u.started = s_.clock.Now();
  u.phase_since = u.started;
  own_.upgrade = std::move(u);
  LendReserveToCanary();
  SaveCommands();
  MakeWayForCanary();
  return OkStatus();
}

Status UpgradePart::CheckPairTakesCanary() const {
  const EngineRecord* p = s_.Find(s_.primary);
  const PairState state = s_.pair.state();
  const bool paired = state == PairState::kReady && s_.Standby() != nullptr;
  const bool degraded = state == PairState::kDegraded || state == PairState::kDegradedBackoff;
  if (p != nullptr && p->serving() && s_.promoting == kNoEngine && (paired || degraded)) {
    return OkStatus();
  }
  return FailedPrecondition(
      std::string("an upgrade needs a serving primary, beside a standby or with its standby "
                  "not ready (pair is ") +
      ToString(state) + ")");
}

void UpgradePart::MakeWayForCanary() {
  std::vector<EngineId> others;
  for (const auto& [id, e] : s_.engines) {
    if (id != s_.primary && e->live()) others.push_back(id);
  }
  if (others.empty()) {
    BATON_LOG(INFO, kLog) << "upgrade: no standby runs: a canary is launched of: "
                          << Joined(own_.upgrade->command);
  }
  for (EngineId id : others) {
    const bool ready = s_.Find(id)->is(EngineState::kStandby);
    BATON_LOG(INFO, kLog) << "upgrade: engine " << id
                          << (ready ? " (the standby)" : " (the standby, not ready)")
                          << " makes way for a canary of: " << Joined(own_.upgrade->command);
    p_.failover->Fence(id, FailCause::kShutdown, "replaced by the canary of an upgrade");
  }
  if (s_.guard.InBackoff()) {
    BATON_LOG(INFO, kLog) << "the crash-loop backoff is lifted: the canary launches now";
    s_.guard.LiftBackoff();
  }
}

Status UpgradePart::SwitchCommandNow(std::vector<std::string> command, UpgradeKind kind) {
  BATON_RETURN_IF_ERROR(s_.effects.CheckCommand(command));
  const TimePoint now = s_.clock.Now();
  own_.history.push_back(
      UpgradeResult{.kind = kind,
                    .outcome = UpgradeOutcome::kPromoted,
                    .reason = "no engine served (pair " + std::string(ToString(s_.pair.state())) +
                              "): no canary to judge; engines launch with it from now on",
                    .canary = kNoEngine,
                    .version = "",
                    .last_weight = 0,
                    .started = now,
                    .ended = now});
  if (own_.history.size() > kKeepUpgrades) own_.history.pop_front();
  own_.previous_command = active_command();
  own_.active_command = std::move(command);
  ++own_.promoted;
  SaveCommands();
  BATON_LOG(WARN, kLog) << ToString(kind) << " with no engine serving (pair "
                        << ToString(s_.pair.state())
                        << "): engines launch from now on with: " << Joined(active_command());
  if (s_.guard.InBackoff()) s_.guard.LiftBackoff();
  RetireStaleStandbys();
  return OkStatus();
}

Status UpgradePart::RequestRollback(UpgradeRequest overrides) {
  if (s_.stopping) return Unavailable("the controller is shutting down");
  if (own_.upgrade.has_value()) {
    if (own_.upgrade->phase == Upgrade::Phase::kRollingBack) {
      return FailedPrecondition("the canary is already being rolled back");
    }
    if (own_.upgrade->phase == Upgrade::Phase::kFinishing) {
      return FailedPrecondition(
          "the canary already takes over as primary; roll back once it serves");
    }
    if (s_.primary == kNoEngine) {
      // Stopping the canary now would leave no engine at all: a cold start.
      return FailedPrecondition(
          "the primary failed during the upgrade and no engine serves yet; roll back once one "
          "does");
    }
    RollBackCanary("batonctl rollback");
    return OkStatus();
  }
  if (own_.previous_command.empty()) {
    return FailedPrecondition("nothing to roll back: no upgrade has been promoted");
  }
  if (const UpgradeResult* last = own_.history.empty() ? nullptr : &own_.history.back();
      last != nullptr && last->outcome == UpgradeOutcome::kRolledBack) {
    // A second `rollback` after the one that ended a canary (or after the judge ended it)
    // would undo the upgrade promoted before it: that takes a command said in full.
    return FailedPrecondition(
        std::string("the last ") + ToString(last->kind) +
        "'s canary was rolled back already: engines run " + Joined(active_command()) +
        "; to go back further, to the command that one replaced, run: batonctl upgrade -- " +
        Joined(own_.previous_command));
  }
  overrides.command = own_.previous_command;
  return StartUpgrade(std::move(overrides), UpgradeKind::kRollback);
}

}  // namespace baton
