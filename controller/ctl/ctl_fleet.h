// The node's registration in etcd (docs/fleet.md) as `batonctl status` shows it.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "controller/controller_status.h"

namespace baton {

// The `fleet` object of `status --json`; null without [fleet].
nlohmann::json FleetJson(const ControllerStatus& c);
// The status text's line ("fleet: node N as KEY: registered, lease L"); "" without [fleet].
std::string FleetText(const ControllerStatus& c);

}  // namespace baton
