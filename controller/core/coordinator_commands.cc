// Coordinator: the engine command record (controller/upgrade/command_record.h). A promoted
// upgrade's command outlives a controller restart; an upgrade in flight is resumed by the
// recovery with the engines it re-adopts, or recorded as rolled back when they are gone.
#include "base/log.h"
#include "controller/core/coordinator.h"

namespace baton {
namespace {

constexpr const char* kLog = "upgrade";

}  // namespace

void Coordinator::SaveCommands() {
  CommandRecord record{s_.config.engine_command, active_command_, previous_command_};
  if (record.active.empty()) record.active = s_.config.engine_command;
  if (upgrade_.has_value()) {
    record.in_flight = InFlightUpgrade{
        .kind = upgrade_->kind,
        .command = upgrade_->command,
        .phase = ToString(upgrade_->phase),
        .canary = upgrade_->canary,
        .weight = upgrade_->judge.has_value() ? upgrade_->judge->weight() : 0,
        .primary = upgrade_->primary,
        .steps = upgrade_->policy.steps,
        .step_duration_ms = static_cast<uint64_t>(
            std::chrono::duration_cast<std::chrono::milliseconds>(upgrade_->policy.step_duration)
                .count()),
        .min_requests = upgrade_->policy.min_requests};
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
void Coordinator::LoadCommands(const StartState& found) {
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
    active_command_ = record.active;
    previous_command_ = record.previous;
    BATON_LOG(INFO, kLog) << "engines run the command of the last promoted upgrade (" << where
                          << "): " << Joined(active_command_);
  } else {
    previous_command_ = record.previous;
  }
  const bool engines_left = found.roster.has_value() && !found.roster->engines.empty();
  if (const std::optional<InFlightUpgrade>& u = record.in_flight; u.has_value() && !engines_left) {
    RecordInterruptedUpgrade(*u, std::string("the controller restarted during the ") +
                                     ToString(u->kind) + " (phase " + u->phase +
                                     "); its engines were gone");
  } else if (!record.ignored.empty()) {
    SaveCommands();
  }
}

void Coordinator::RecordInterruptedUpgrade(const InFlightUpgrade& u, const std::string& reason) {
  BATON_LOG(WARN, kLog) << ToString(u.kind) << " " << ToString(UpgradeOutcome::kRolledBack)
                        << " (engine " << u.canary << "): " << reason;
  upgrade_history_.push_back(UpgradeResult{.kind = u.kind,
                                           .outcome = UpgradeOutcome::kRolledBack,
                                           .reason = reason,
                                           .canary = u.canary,
                                           .version = "",
                                           .last_weight = u.weight,
                                           .started = s_.clock.Now(),
                                           .ended = s_.clock.Now()});
  if (upgrade_history_.size() > kKeepUpgrades) upgrade_history_.pop_front();
  ++upgrades_rolled_back_;
  SaveCommands();  // the interrupted upgrade is recorded once
}

}  // namespace baton
