// UpgradePart: the engine command record (controller/core/command_record.h). A promoted
// upgrade's command outlives a controller restart; an upgrade in flight is resumed by the
// recovery with the engines it re-adopts, or recorded as rolled back when they are gone.
#include <utility>

#include "base/log.h"
#include "controller/core/coordinator_parts.h"

namespace baton {

namespace {

constexpr const char* kLog = "upgrade";

}  // namespace

void UpgradePart::SaveCommands() {
  CommandRecord record{s_.config.engine_command, own_.active_command, own_.previous_command};
  if (record.active.empty()) record.active = s_.config.engine_command;
  if (own_.upgrade.has_value()) {
    record.in_flight = InFlightUpgrade{
        .kind = own_.upgrade->kind,
        .command = own_.upgrade->command,
        .phase = own_.upgrade->phase,
        .canary = own_.upgrade->canary,
        .weight = own_.upgrade->judge.has_value() ? own_.upgrade->judge->weight() : 0,
        .primary = own_.upgrade->primary,
        .steps = own_.upgrade->policy.steps,
        .step_duration_ms =
            static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                      own_.upgrade->policy.step_duration)
                                      .count()),
        .min_requests = own_.upgrade->policy.min_requests};
  }
  if (Status saved = s_.effects.SaveCommandRecord(record); !saved.ok()) {
    BATON_LOG(ERROR, kLog) << "the engine command record is not saved (a restart would launch "
                              "engine.command and forget an upgrade in flight): "
                           << saved.ToString();
  }
}

// Start-up: the command a promoted upgrade put in place, if engine.command is unchanged. An
// upgrade in flight is resumed by the recovery when its engines reattach; without a roster
// (its engines are gone) it is recorded as rolled back.
void UpgradePart::LoadCommands(const StartState& found) {
  const std::string where = s_.config.command_record_path();
  if (!found.commands_error.empty()) {
    BATON_LOG(WARN, kLog) << "ignoring the saved engine command: " << found.commands_error;
  }
  if (!found.commands.has_value()) return;
  const CommandRecord& record = *found.commands;
  if (!record.ignored.empty()) {
    BATON_LOG(WARN, kLog) << "ignoring the upgrade in flight saved in " << where << ": "
                          << record.ignored;
  }
  if (record.configured != s_.config.engine_command) {
    BATON_LOG(WARN, kLog) << "engine.command changed since " << where
                          << " was written: engines run engine.command";
  } else if (record.active != s_.config.engine_command) {
    own_.active_command = record.active;
    own_.previous_command = record.previous;
    BATON_LOG(INFO, kLog) << "engines run the command of the last promoted upgrade (" << where
                          << "): " << Joined(own_.active_command);
  } else {
    own_.previous_command = record.previous;
  }
  const bool engines_left = found.roster.has_value() && !found.roster->engines.empty();
  if (const std::optional<InFlightUpgrade>& u = record.in_flight; u.has_value() && !engines_left) {
    RecordInterruptedUpgrade(*u, std::string("the controller restarted during the ") +
                                     ToString(u->kind) + " (phase " + ToString(u->phase) +
                                     "); its engines were gone");
  } else if (!record.ignored.empty()) {
    SaveCommands();
  }
}

void UpgradePart::RecordInterruptedUpgrade(const InFlightUpgrade& u, const std::string& reason) {
  BATON_LOG(WARN, kLog) << ToString(u.kind) << " " << ToString(UpgradeOutcome::kRolledBack)
                        << " (engine " << u.canary << "): " << reason;
  own_.history.push_back(UpgradeResult{.kind = u.kind,
                                       .outcome = UpgradeOutcome::kRolledBack,
                                       .reason = reason,
                                       .canary = u.canary,
                                       .version = "",
                                       .last_weight = u.weight,
                                       .started = s_.clock.Now(),
                                       .ended = s_.clock.Now()});
  if (own_.history.size() > kKeepUpgrades) own_.history.pop_front();
  ++own_.rolled_back;
  SaveCommands();  // the interrupted upgrade is recorded once
}

// An upgrade in flight when the previous controller went away goes on where its engines
// are: a serving canary resumes its step (the judge starts the step again from what the
// routers report now), a canary sent its Promote finishes that, a draining side finishes its
// drain; anything earlier (a canary re-adopted as a standby) is rolled back.
std::string UpgradePart::ResumeUpgrade(const InFlightUpgrade& u) {
  EngineRecord* c = s_.Find(u.canary);
  EngineRecord* p = s_.Find(s_.primary);
  Upgrade up = UpgradeFromRecord(u, p);
  // The canary had passed every step and the old primary drained while no controller ran (its
  // Drained lost with the controller; fenced at its Reattach): the canary takes over.
  const bool old_primary_drained = u.phase == UpgradePhase::kFinishing && p == nullptr &&
                                   c != nullptr && c->live() && c->serving();
  std::string outcome;
  if (old_primary_drained) {
    own_.upgrade = std::move(up);
    outcome =
        "resumed: the old primary did not come back (it had drained, or was lost); the "
        "canary takes over";
  } else if (const std::string why = WhyNotResumed(up, c, p); !why.empty()) {
    const std::string interrupted = "the controller restarted during the " +
                                    std::string(ToString(u.kind)) + " (phase " + ToString(u.phase) +
                                    "); " + why;
    outcome = "rolled back: " + why;
    if (c != nullptr && c->live()) {
      own_.upgrade = std::move(up);
      RollBackCanary(interrupted);
    } else {
      RecordInterruptedUpgrade(u, interrupted);
    }
  } else {
    outcome = ResumePhase(std::move(up), u, *c, *p);
  }
  FinishResume(u, c, old_primary_drained, outcome);
  return ToString(u.kind) + (" " + outcome);
}

Upgrade UpgradePart::UpgradeFromRecord(const InFlightUpgrade& u, const EngineRecord* p) const {
  Upgrade up;
  up.kind = u.kind;
  up.command = u.command;
  up.previous = active_command();
  up.policy = s_.config.canary;
  if (!u.steps.empty()) up.policy.steps = u.steps;
  if (u.step_duration_ms > 0) {
    up.policy.step_duration = std::chrono::milliseconds(u.step_duration_ms);
  }
  if (u.min_requests > 0) up.policy.min_requests = u.min_requests;
  up.primary = p != nullptr ? p->id : kNoEngine;
  up.canary = u.canary;
  up.phase = u.phase;  // the phase it had reached, until ResumePhase decides
  up.started = up.phase_since = s_.clock.Now();
  return up;
}

// Only a canary that serves, drains or was sent its Promote goes on; one re-adopted as a
// standby (launched, its blocks being reclaimed, its Promote not sent yet) is rolled back.
std::string UpgradePart::WhyNotResumed(const Upgrade& up, const EngineRecord* c,
                                       const EngineRecord* p) const {
  if (c == nullptr || !c->live()) return "its canary did not come back";
  if (!c->serving() && !c->is(EngineState::kDraining) && !c->is(EngineState::kPromoting)) {
    return "its canary came back as a standby, not promoted yet";
  }
  if (p == nullptr) return "its primary did not come back";
  if (const Status policy = ValidateCanaryPolicy(up.policy); !policy.ok()) {
    return "its saved policy is refused: " + policy.message();
  }
  return "";
}

std::string UpgradePart::ResumePhase(Upgrade up, const InFlightUpgrade& u, EngineRecord& c,
                                     EngineRecord& p) {
  if (c.is(EngineState::kPromoting)) {
    up.phase = Upgrade::Phase::kPromoting;
    own_.upgrade = std::move(up);
    // The canary stands in for the standby, as its StandbyReady did before the restart: the
    // upgrade finishes only from a ready pair.
    s_.StepPairIfAllowed(PairEvent::kStandbyReady);
    return "resumed: the canary's promotion";
  }
  if (c.is(EngineState::kDraining)) {
    up.phase = Upgrade::Phase::kRollingBack;
    own_.upgrade = std::move(up);
    return "resumed: the canary's rollback";
  }
  if (p.is(EngineState::kDraining)) {
    up.phase = Upgrade::Phase::kFinishing;
    own_.upgrade = std::move(up);
    p_.commands->OpenPlannedTimeline(PromotionKind::kUpgrade, "canary passed every step", p,
                                     u.canary);
    // The canary stands in for the standby, as its StandbyReady did before the restart.
    s_.StepPairIfAllowed(PairEvent::kStandbyReady);
    s_.StepPairIfAllowed(PairEvent::kGracefulPromoteRequested);
    return "resumed: the canary takes over once the old primary drained";
  }
  up.phase = Upgrade::Phase::kCanary;
  up.judge.emplace(s_.clock, up.policy, p.id, c.id, s_.effects.RouterOutcomes());
  const OutcomeMap now = s_.effects.RouterOutcomes();
  while (up.judge->weight() < u.weight && !up.judge->last_step()) up.judge->Advance(now);
  own_.upgrade = std::move(up);
  s_.StepPairIfAllowed(PairEvent::kStandbyReady);  // the serving canary stands in for the standby
  return "resumed at " + std::to_string(own_.upgrade->judge->weight()) + " %";
}

void UpgradePart::FinishResume(const InFlightUpgrade& u, EngineRecord* c, bool old_primary_drained,
                               const std::string& outcome) {
  if (own_.upgrade.has_value() && c != nullptr && c->live()) {  // as PromoteCanary names it
    c->machine.set_name("engine " + std::to_string(c->id) + " (canary)");
  }
  BATON_LOG(INFO, "upgrade") << ToString(u.kind) << " " << outcome << " (engine " << u.canary
                             << ")";
  if (own_.upgrade.has_value()) LendReserveToCanary();
  SaveCommands();
  if (old_primary_drained) (void)CanaryTakesOver(u.primary, "");
  if (c != nullptr && c->held_promote_ack.has_value()) {
    const uint64_t epoch = *std::exchange(c->held_promote_ack, std::nullopt);
    if (PromotingCanary(c->id) && c->is(EngineState::kPromoting)) OnCanaryPromoted(*c, epoch);
  }
}

}  // namespace baton
