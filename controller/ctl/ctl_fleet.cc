#include "controller/ctl/ctl_fleet.h"

namespace baton {

using nlohmann::json;

json FleetJson(const ControllerStatus& c) {
  if (c.fleet_key.empty()) return nullptr;
  const NodeRegistration& f = c.fleet;
  return {{"key", c.fleet_key},
          {"node", c.config->fleet_node},
          {"model", c.config->fleet_model},
          {"registered", f.registered},
          {"lease", f.lease},
          {"writes", f.writes},
          {"leases", f.leases},
          {"etcd_failures", f.failures},
          {"etcd_error", f.last_error.empty() ? json(nullptr) : json(f.last_error)}};
}

std::string FleetText(const ControllerStatus& c) {
  if (c.fleet_key.empty()) return "";
  return "fleet: node " + c.config->fleet_node + " as " + c.fleet_key + ": " +
         (c.fleet.registered ? "registered, lease " + std::to_string(c.fleet.lease)
                             : std::string("NOT registered")) +
         (c.fleet.last_error.empty() ? "" : "; etcd: " + c.fleet.last_error) + "\n";
}

}  // namespace baton
