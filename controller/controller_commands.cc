// Controller: the engine command record (controller/upgrade/command_record.h). A promoted upgrade's
// command outlives a controller restart; an upgrade the restart interrupted is recorded as
// rolled back (its engines, the canary too, died with the old controller).
#include "base/log.h"
#include "controller/controller.h"
#include "controller/upgrade/command_record.h"

namespace baton {
namespace {

constexpr const char* kLog = "upgrade";

}  // namespace

void Controller::SaveCommands() {
  CommandRecord record{config_.engine_command, active_command_, previous_command_};
  if (record.active.empty()) record.active = config_.engine_command;
  if (upgrade_.has_value()) {
    record.in_flight =
        InFlightUpgrade{.kind = upgrade_->kind,
                        .command = upgrade_->command,
                        .phase = ToString(upgrade_->phase),
                        .canary = upgrade_->canary,
                        .weight = upgrade_->judge.has_value() ? upgrade_->judge->weight() : 0};
  }
  if (Status saved = SaveCommandRecord(config_.command_record_path(), record); !saved.ok()) {
    BATON_LOG(ERROR, kLog) << "the engine command record is not saved (a restart would launch "
                              "engine.command and forget an upgrade in flight): "
                           << saved.ToString();
  }
}

void Controller::LoadCommands() {
  const std::string path = config_.command_record_path();
  Result<std::optional<CommandRecord>> loaded = LoadCommandRecord(path);
  if (!loaded.ok()) {
    BATON_LOG(WARN, kLog) << "ignoring the saved engine command: " << loaded.status().message();
    return;
  }
  if (!loaded->has_value()) return;
  const CommandRecord& record = **loaded;
  if (!record.ignored.empty()) {
    BATON_LOG(WARN, kLog) << "ignoring the upgrade in flight saved in " << path << ": "
                          << record.ignored;
  }
  if (const std::optional<InFlightUpgrade>& u = record.in_flight; u.has_value()) {
    const std::string reason = "the controller restarted during the " + u->kind + " (phase " +
                               u->phase + "); its engines died with it";
    BATON_LOG(WARN, kLog) << u->kind << " rolled_back (engine " << u->canary << "): " << reason;
    upgrade_history_.push_back(UpgradeResult{.kind = u->kind,
                                             .outcome = "rolled_back",
                                             .reason = reason,
                                             .canary = u->canary,
                                             .version = "",
                                             .last_weight = u->weight,
                                             .started = clock_.Now(),
                                             .ended = clock_.Now()});
    ++upgrades_rolled_back_;
  }
  if (record.configured != config_.engine_command) {
    BATON_LOG(WARN, kLog) << "engine.command changed since " << path
                          << " was written: engines run engine.command";
  } else if (record.active != config_.engine_command) {
    active_command_ = record.active;
    previous_command_ = record.previous;
    BATON_LOG(INFO, kLog) << "engines run the command of the last promoted upgrade (" << path
                          << "): " << Joined(active_command_);
  } else {
    previous_command_ = record.previous;
  }
  // The interrupted upgrade is recorded (or its unreadable entry reported) once.
  if (record.in_flight.has_value() || !record.ignored.empty()) SaveCommands();
}

}  // namespace baton
