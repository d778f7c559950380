// `batonctl upgrade` and `batonctl rollback` on the controller's side (ParseUpgradeArgs,
// ParseRollbackArgs), and the upgrade's part of the status (UpgradeJson, UpgradeText,
// UpgradeMetrics).
//
//   upgrade [--steps 10,50,100] [--step-ms N] [--min-requests N] -- ENGINE COMMAND...
//   upgrade [...] --engine-cmd "ENGINE COMMAND"
//   rollback [--steps 10,50,100] [--step-ms N] [--min-requests N]  (options: only with no
//                                                                   upgrade running)
// The command takes the same placeholders as engine.command. Thread: io_context thread.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "controller/controller_status.h"
#include "controller/core/upgrade.h"
#include "proto/messages.h"

namespace baton {

// Parses `args` of `batonctl upgrade` (`rollback`: no command allowed) into a request;
// InvalidArgument names what is wrong.
Result<UpgradeRequest> ParseUpgradeArgs(const std::vector<std::string>& args);
Result<UpgradeRequest> ParseRollbackArgs(const std::vector<std::string>& args);
// `rollback`'s --steps, --step-ms and --min-requests shape the canary of a rollback that
// upgrades back to the previous command (no upgrade running). With an upgrade running they
// cannot apply (its canary is drained, or stopped, at once): FailedPrecondition says so.
Status CheckRollbackOptions(const UpgradeRequest& request, bool upgrade_running);

// The upgrade in flight (null when none), the last ones, and the commands in use.
nlohmann::json UpgradeJson(const ControllerStatus& status);
// One or two lines for `batonctl status`; empty when no upgrade ever ran.
std::string UpgradeText(const ControllerStatus& status);
// Prometheus lines: baton_upgrades_total{outcome}, baton_canary_weight_percent.
std::string UpgradeMetrics(const ControllerStatus& status);

}  // namespace baton
