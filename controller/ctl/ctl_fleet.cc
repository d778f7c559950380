#include "controller/ctl/ctl_fleet.h"

#include <sstream>

#include "base/text/metric_number.h"

namespace baton {

using nlohmann::json;

namespace {

constexpr NodeRolloutState kNodeStates[] = {
    NodeRolloutState::kPending,     NodeRolloutState::kUpgrading,  NodeRolloutState::kPromoted,
    NodeRolloutState::kRollingBack, NodeRolloutState::kRolledBack, NodeRolloutState::kFailed};
constexpr RolloutState kStates[] = {RolloutState::kRunning,     RolloutState::kPaused,
                                    RolloutState::kRollingBack, RolloutState::kDone,
                                    RolloutState::kRolledBack,  RolloutState::kFailed,
                                    RolloutState::kAborted};

json RolloutStatusJson(const RolloutSnapshot& r) {
  if (!r.seen) return nullptr;
  json nodes = json::object();
  for (NodeRolloutState s : kNodeStates) nodes[ToString(s)] = r.nodes[static_cast<int>(s)];
  return {{"id", r.id},
          {"state", ToString(r.state)},
          {"settled", r.settled},
          {"node_state", r.node_state.has_value() ? json(ToString(*r.node_state)) : json(nullptr)},
          {"nodes", nodes},
          {"writes", r.writes},
          {"conflicts", r.conflicts},
          {"steps", r.steps},
          {"refused_programs", r.refused_programs},
          {"refused_program", r.refused_program.empty() ? json(nullptr)
                                                        : json{{"rollout", r.refused_rollout},
                                                               {"reason", r.refused_program}}},
          {"etcd_failures", r.etcd_failures}};
}

}  // namespace

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
          {"etcd_error", f.last_error.empty() ? json(nullptr) : json(f.last_error)},
          {"conflict", f.conflict.empty() ? json(nullptr) : json(f.conflict)},
          {"rollout", RolloutStatusJson(c.rollout)}};
}

std::string FleetText(const ControllerStatus& c) {
  if (c.fleet_key.empty()) return "";
  return "fleet: node " + c.config->fleet_node + " as " + c.fleet_key + ": " +
         (c.fleet.registered ? "registered, lease " + std::to_string(c.fleet.lease)
                             : std::string("NOT registered")) +
         (c.fleet.conflict.empty() ? "" : " (" + c.fleet.conflict + ")") +
         (c.fleet.last_error.empty() ? "" : "; etcd: " + c.fleet.last_error) + "\n" +
         (c.rollout.seen && !c.rollout.settled
              ? "fleet rollout " + c.rollout.id + ": " + ToString(c.rollout.state) +
                    (c.rollout.node_state.has_value()
                         ? std::string(", this node ") + ToString(*c.rollout.node_state)
                         : std::string(", this node not in it")) +
                    "\n"
              : "") +
         (c.rollout.seen && c.rollout.id == c.rollout.refused_rollout
              ? "fleet rollout " + c.rollout.id +
                    " REFUSED on this node: " + c.rollout.refused_program + "\n"
              : "");
}

std::string FleetMetrics(const ControllerStatus& c) {
  if (c.fleet_key.empty()) return "";
  std::ostringstream out;
  auto one = [&](const char* name, const char* type, const char* help, double v) {
    out << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n"
        << name << " " << MetricNumber(v) << "\n";
  };
  one("baton_fleet_registered", "gauge", "1 while the node's record is in etcd under a live lease",
      c.fleet.registered ? 1 : 0);
  one("baton_fleet_etcd_failures_total", "counter", "Calls to etcd that failed",
      static_cast<double>(c.fleet.failures));
  one("baton_fleet_leases_total", "counter",
      "Leases the node was granted (more than one: one was lost)",
      static_cast<double>(c.fleet.leases));
  const RolloutSnapshot& r = c.rollout;
  one("baton_fleet_rollout_active", "gauge", "1 while a fleet-wide upgrade is not settled",
      r.seen && !r.settled ? 1 : 0);
  out << "# HELP baton_fleet_rollout_state 1 for the state of the last fleet-wide upgrade seen\n"
      << "# TYPE baton_fleet_rollout_state gauge\n";
  for (RolloutState s : kStates) {
    out << "baton_fleet_rollout_state{state=\"" << ToString(s) << "\"} "
        << (r.seen && r.state == s ? 1 : 0) << "\n";
  }
  out << "# HELP baton_fleet_rollout_nodes Nodes of the last fleet-wide upgrade, by state\n"
      << "# TYPE baton_fleet_rollout_nodes gauge\n";
  for (NodeRolloutState s : kNodeStates) {
    out << "baton_fleet_rollout_nodes{state=\"" << ToString(s) << "\"} "
        << r.nodes[static_cast<int>(s)] << "\n";
  }
  one("baton_fleet_rollout_writes_total", "counter",
      "Rollout records this node wrote (compare-and-put)", static_cast<double>(r.writes));
  one("baton_fleet_rollout_conflicts_total", "counter",
      "Rollout writes that found the record moved on and read it again",
      static_cast<double>(r.conflicts));
  one("baton_fleet_rollout_steps_total", "counter",
      "Canaries, canary rollbacks and ways back this node started for a rollout",
      static_cast<double>(r.steps));
  one("baton_fleet_rollout_refused_programs_total", "counter",
      "Rollout steps this node refused because their program is not in fleet.rollout_programs",
      static_cast<double>(r.refused_programs));
  return out.str();
}

}  // namespace baton
