// The node's registration in etcd, and what it saw of fleet-wide upgrades (docs/fleet.md), as
// `batonctl status` and /metrics show them.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "controller/controller_status.h"

namespace baton {

// The `fleet` object of `status --json`; null without [fleet].
nlohmann::json FleetJson(const ControllerStatus& c);
// The status text's line ("fleet: node N as KEY: registered, lease L"); "" without [fleet].
std::string FleetText(const ControllerStatus& c);
// Prometheus lines of the registration and of fleet-wide upgrades (baton_fleet_*); "" without
// [fleet].
std::string FleetMetrics(const ControllerStatus& c);

}  // namespace baton
