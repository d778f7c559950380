// The controller's side of `batonctl` (HandleCtlRequest), and its status in the forms
// operators read: text, JSON and Prometheus metrics (StatusText, StatusJson, MetricsText).
//
// HandleCtlRequest() runs one command (status, promote, drain, drill kill|hang|error,
// timeline, upgrade, rollback, controller restart) against the controller and returns the reply:
// exit code 0 done, 1 refused (the text says why), 2 bad usage; `json` is always one JSON object
// ({"ok": false, "error": ...} on failure). Thread: the controller's io_context thread.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "controller/controller.h"
#include "proto/messages.h"

namespace baton {

proto::CtlReply HandleCtlRequest(Controller& controller, const proto::CtlRequest& request);

// The whole status (pair, engines, epochs, pool, weights, crash-loop guard, transitions,
// refusals, recent exits, invariants).
nlohmann::json StatusJson(const ControllerStatus& status);
std::string StatusText(const ControllerStatus& status);

// Prometheus text exposition of the controller's gauges and counters.
std::string MetricsText(const ControllerStatus& status);

// The usage text of batonctl's commands (`batonctl --help`).
const char* CtlUsage();
// The line that follows a usage error in place of the whole usage text: where to find it.
const char* CtlUsageHint();

// Whether `args` fit `command` (one of batonctl's commands, `fleet` excepted: CheckFleetArgs);
// InvalidArgument naming the real problem ("unexpected argument 'x'", "unknown command ...")
// when not. Both batonctl and the controller check with it.
Status CheckCtlArgs(const std::string& command, const std::vector<std::string>& args);

}  // namespace baton
