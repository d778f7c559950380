#include "controller/rollout/rollout_record.h"

#include <chrono>
#include <cmath>
#include <utility>

#include "base/text/json_depth.h"
#include "base/text/json_field.h"

namespace baton {
namespace {

using nlohmann::json;

constexpr int kMaxDepth = 8;

constexpr const char* kRolloutStates[] = {"running",     "paused", "rolling_back", "done",
                                          "rolled_back", "failed", "aborted"};
constexpr const char* kNodeStates[] = {"pending",      "upgrading",   "promoted",
                                       "rolling_back", "rolled_back", "failed"};

Status Missing(const char* field) {
  return InvalidArgument(std::string("rollout record: field '") + field + "' is missing or wrong");
}

template <class T>
Result<T> Field(const json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end()) return Missing(name);
  if constexpr (std::is_same_v<T, std::string>) {
    if (!it->is_string()) return Missing(name);
  } else if constexpr (std::is_same_v<T, bool>) {
    if (!it->is_boolean()) return Missing(name);
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!it->is_number()) return Missing(name);
  } else {
    if (!JsonIntegerFits<T>(*it)) return Missing(name);
  }
  return it->get<T>();
}

Result<std::vector<std::string>> Strings(const json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end() || !it->is_array()) return Missing(name);
  std::vector<std::string> out;
  for (const json& s : *it) {
    if (!s.is_string()) return Missing(name);
    out.push_back(s.get<std::string>());
  }
  return out;
}

Result<NodeRollout> ParseNode(const json& j) {
  if (!j.is_object()) return Missing("nodes");
  NodeRollout n;
  BATON_ASSIGN_OR_RETURN(n.node, Field<std::string>(j, "node"));
  BATON_ASSIGN_OR_RETURN(std::string state, Field<std::string>(j, "state"));
  std::optional<NodeRolloutState> s = ParseNodeRolloutState(state);
  if (!s.has_value()) return InvalidArgument("rollout record: unknown node state '" + state + "'");
  n.state = *s;
  BATON_ASSIGN_OR_RETURN(n.started, Field<bool>(j, "started"));
  BATON_ASSIGN_OR_RETURN(n.reason, Field<std::string>(j, "reason"));
  BATON_ASSIGN_OR_RETURN(n.version, Field<std::string>(j, "version"));
  BATON_ASSIGN_OR_RETURN(n.since_ms, Field<int64_t>(j, "since_ms"));
  if (n.node.empty()) return InvalidArgument("rollout record: a node without a name");
  return n;
}

}  // namespace

const char* ToString(RolloutState state) { return kRolloutStates[static_cast<int>(state)]; }
const char* ToString(NodeRolloutState state) { return kNodeStates[static_cast<int>(state)]; }

std::optional<RolloutState> ParseRolloutState(std::string_view text) {
  for (size_t i = 0; i < std::size(kRolloutStates); ++i) {
    if (text == kRolloutStates[i]) return static_cast<RolloutState>(i);
  }
  return std::nullopt;
}

std::optional<NodeRolloutState> ParseNodeRolloutState(std::string_view text) {
  for (size_t i = 0; i < std::size(kNodeStates); ++i) {
    if (text == kNodeStates[i]) return static_cast<NodeRolloutState>(i);
  }
  return std::nullopt;
}

NodeRollout* Rollout::Find(std::string_view node) {
  for (NodeRollout& n : nodes) {
    if (n.node == node) return &n;
  }
  return nullptr;
}

const NodeRollout* Rollout::Find(std::string_view node) const {
  return const_cast<Rollout*>(this)->Find(node);
}

size_t Rollout::Count(NodeRolloutState state) const {
  size_t n = 0;
  for (const NodeRollout& x : nodes) n += x.state == state ? 1 : 0;
  return n;
}

std::string FleetRolloutKey(const std::string& prefix) { return prefix + "rollout"; }

json RolloutJson(const Rollout& r) {
  json nodes = json::array();
  for (const NodeRollout& n : r.nodes) {
    nodes.push_back({{"node", n.node},
                     {"state", ToString(n.state)},
                     {"started", n.started},
                     {"reason", n.reason},
                     {"version", n.version},
                     {"since_ms", n.since_ms}});
  }
  return {{"id", r.id},
          {"command", r.command},
          {"batch", r.batch},
          {"fraction", r.fraction},
          {"keep_upgraded", r.keep_upgraded},
          {"steps", r.steps},
          {"step_ms", r.step_ms},
          {"min_requests", r.min_requests},
          {"state", ToString(r.state)},
          {"reason", r.reason},
          {"started_by", r.started_by},
          {"created_ms", r.created_ms},
          {"updated_ms", r.updated_ms},
          {"nodes", nodes}};
}

std::string RolloutRecord(const Rollout& r) {
  return RolloutJson(r).dump(-1, ' ', false, json::error_handler_t::replace);
}

Result<Rollout> ParseRolloutRecord(std::string_view value) {
  json j = JsonNestingDepth(value) > kMaxDepth ? json(json::value_t::discarded)
                                               : json::parse(value, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return InvalidArgument("rollout record: not a JSON object");
  }
  Rollout r;
  BATON_ASSIGN_OR_RETURN(r.id, Field<std::string>(j, "id"));
  BATON_ASSIGN_OR_RETURN(r.command, Strings(j, "command"));
  if (r.command.empty()) return InvalidArgument("rollout record: an empty command");
  BATON_ASSIGN_OR_RETURN(r.batch, Field<uint32_t>(j, "batch"));
  if (r.batch == 0) return InvalidArgument("rollout record: batch 0");
  BATON_ASSIGN_OR_RETURN(r.fraction, Field<double>(j, "fraction"));
  BATON_ASSIGN_OR_RETURN(r.keep_upgraded, Field<bool>(j, "keep_upgraded"));
  auto steps = j.find("steps");
  if (steps == j.end() || !steps->is_array()) return Missing("steps");
  for (const json& s : *steps) {
    if (!s.is_number_unsigned() || s.get<uint64_t>() > 100) return Missing("steps");
    r.steps.push_back(s.get<uint32_t>());
  }
  BATON_ASSIGN_OR_RETURN(r.step_ms, Field<uint64_t>(j, "step_ms"));
  BATON_ASSIGN_OR_RETURN(r.min_requests, Field<uint64_t>(j, "min_requests"));
  BATON_ASSIGN_OR_RETURN(std::string state, Field<std::string>(j, "state"));
  std::optional<RolloutState> s = ParseRolloutState(state);
  if (!s.has_value()) return InvalidArgument("rollout record: unknown state '" + state + "'");
  r.state = *s;
  BATON_ASSIGN_OR_RETURN(r.reason, Field<std::string>(j, "reason"));
  BATON_ASSIGN_OR_RETURN(r.started_by, Field<std::string>(j, "started_by"));
  BATON_ASSIGN_OR_RETURN(r.created_ms, Field<int64_t>(j, "created_ms"));
  BATON_ASSIGN_OR_RETURN(r.updated_ms, Field<int64_t>(j, "updated_ms"));
  auto nodes = j.find("nodes");
  if (nodes == j.end() || !nodes->is_array()) return Missing("nodes");
  for (const json& n : *nodes) {
    BATON_ASSIGN_OR_RETURN(NodeRollout node, ParseNode(n));
    if (r.Find(node.node) != nullptr) {
      return InvalidArgument("rollout record: node '" + node.node + "' is listed twice");
    }
    r.nodes.push_back(std::move(node));
  }
  return r;
}

uint32_t BatchOfFraction(double fraction, size_t nodes) {
  if (nodes == 0) return 1;
  const double n = std::ceil(fraction * static_cast<double>(nodes) - 1e-9);
  if (!(n >= 1)) return 1;
  return n >= static_cast<double>(nodes) ? static_cast<uint32_t>(nodes) : static_cast<uint32_t>(n);
}

int64_t UnixMillisNow() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace baton
