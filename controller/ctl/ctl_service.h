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

// The usage text of batonctl's commands.
const char* CtlUsage();

}  // namespace baton
