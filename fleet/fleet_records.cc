#include "fleet/fleet_records.h"

#include <nlohmann/json.hpp>
#include <utility>

#include "base/text/json_depth.h"
#include "base/text/json_field.h"

namespace baton {
namespace {

using nlohmann::json;

constexpr int kMaxDepth = 16;

Result<json> ParseObject(std::string_view key, std::string_view value) {
  json j = JsonNestingDepth(value) > kMaxDepth ? json(json::value_t::discarded)
                                               : json::parse(value, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return InvalidArgument(std::string(key) + ": the record is not a JSON object");
  }
  return j;
}

// The field `name` of `j` as T; InvalidArgument naming the key and the field otherwise.
template <class T>
Result<T> Field(std::string_view key, const json& j, const char* name) {
  auto it = j.find(name);
  const bool ok = it != j.end() && (std::is_same_v<T, std::string> ? it->is_string()
                                    : std::is_same_v<T, bool>      ? it->is_boolean()
                                                                   : it->is_number_integer());
  if (!ok) return InvalidArgument(std::string(key) + ": field '" + name + "' is missing or wrong");
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    if (!JsonIntegerFits<T>(*it))
      return InvalidArgument(std::string(key) + ": field '" + name + "' is out of range");
  }
  return it->template get<T>();
}

Result<proto::RouteEntry> ParseEntry(std::string_view key, const json& e) {
  if (!e.is_object()) return InvalidArgument(std::string(key) + ": a route entry is not an object");
  proto::RouteEntry r;
  BATON_ASSIGN_OR_RETURN(r.engine_id, Field<uint64_t>(key, e, "engine_id"));
  BATON_ASSIGN_OR_RETURN(const std::string role, Field<std::string>(key, e, "role"));
  Result<proto::EngineRole> parsed = proto::ParseEngineRole(role);
  if (!parsed.ok()) return InvalidArgument(std::string(key) + ": " + parsed.status().message());
  r.role = *parsed;
  BATON_ASSIGN_OR_RETURN(r.http_address, Field<std::string>(key, e, "http_address"));
  BATON_ASSIGN_OR_RETURN(r.ready, Field<bool>(key, e, "ready"));
  BATON_ASSIGN_OR_RETURN(r.weight, Field<uint32_t>(key, e, "weight"));
  if (r.weight > 100) {
    return InvalidArgument(std::string(key) + ": field 'weight' is " + std::to_string(r.weight) +
                           ", past 100 (a percentage)");
  }
  if (e.contains("engine_version") && e["engine_version"].is_string()) {
    r.engine_version = e["engine_version"].get<std::string>();
  }
  return r;
}

}  // namespace

std::string FleetNodesPrefix(const std::string& prefix) { return prefix + "nodes/"; }

std::optional<std::string> FleetNodeOfKey(std::string_view nodes_prefix, std::string_view key) {
  if (!key.starts_with(nodes_prefix)) return std::nullopt;
  const std::string_view node = key.substr(nodes_prefix.size());
  if (node.empty() || node.find('/') != std::string_view::npos) return std::nullopt;
  return std::string(node);
}

std::string FleetReportsPrefix(const std::string& prefix, const std::string& node) {
  return prefix + "reports/" + node + "/";
}

std::string FleetReportKey(const std::string& prefix, const std::string& node,
                           const std::string& router) {
  return FleetReportsPrefix(prefix, node) + router;
}

namespace {

// The record's weights, capacity and load: optional (older records have none), and a field of
// the wrong type is read as absent.
void ParseNodeUse(const json& j, FleetNode* n) {
  auto number = [&j](const char* object, const char* field) -> uint64_t {
    const auto o = j.find(object);
    if (o == j.end() || !o->is_object()) return 0;
    const auto f = o->find(field);
    return f != o->end() && f->is_number_unsigned() ? f->get<uint64_t>() : 0;
  };
  if (const auto w = j.find("weights"); w != j.end() && w->is_object()) {
    const auto id = w->find("id");
    if (id != w->end() && id->is_string()) n->weights_id = id->get<std::string>();
  }
  n->pool_blocks = number("capacity", "pool_blocks");
  n->pool_granted_blocks = number("load", "pool_granted_blocks");
}

}  // namespace

Result<FleetNode> ParseNodeRecord(std::string_view key, std::string_view value) {
  BATON_ASSIGN_OR_RETURN(json j, ParseObject(key, value));
  FleetNode n;
  BATON_ASSIGN_OR_RETURN(n.name, Field<std::string>(key, j, "node"));
  BATON_ASSIGN_OR_RETURN(n.model, Field<std::string>(key, j, "model"));
  if (n.name.empty()) return InvalidArgument(std::string(key) + ": field 'node' is empty");
  // A record speaks only for the node of its own key: one under another key (by hand, or a
  // controller of another name) must not take that node's place in the routers.
  const std::string_view key_node = key.substr(key.rfind('/') + 1);
  if (n.name != key_node) {
    return InvalidArgument(std::string(key) + ": field 'node' is '" + n.name +
                           "', not the key's node '" + std::string(key_node) + "'");
  }
  if (j.contains("controller") && j["controller"].is_object()) {
    const json& c = j["controller"];
    if (c.contains("pid") && c["pid"].is_number_integer()) n.controller_pid = c["pid"];
    if (c.contains("started_at") && c["started_at"].is_number_integer()) {
      n.controller_started_at = c["started_at"];
    }
  }
  ParseNodeUse(j, &n);
  auto routes = j.find("routes");
  if (routes == j.end() || !routes->is_object()) {
    return InvalidArgument(std::string(key) + ": field 'routes' is missing or wrong");
  }
  BATON_ASSIGN_OR_RETURN(n.routes.version, Field<uint64_t>(key, *routes, "version"));
  BATON_ASSIGN_OR_RETURN(n.routes.epoch, Field<uint64_t>(key, *routes, "epoch"));
  BATON_ASSIGN_OR_RETURN(n.routes.pair_state, Field<std::string>(key, *routes, "pair_state"));
  auto entries = routes->find("entries");
  if (entries == routes->end() || !entries->is_array()) {
    return InvalidArgument(std::string(key) + ": field 'routes.entries' is missing or wrong");
  }
  for (const json& e : *entries) {
    BATON_ASSIGN_OR_RETURN(proto::RouteEntry entry, ParseEntry(key, e));
    n.routes.entries.push_back(std::move(entry));
  }
  return n;
}

Result<std::string> ListedFleetNode(std::string_view nodes_prefix, std::string_view key,
                                    std::string_view value) {
  std::optional<std::string> node = FleetNodeOfKey(nodes_prefix, key);
  if (!node.has_value()) {
    return InvalidArgument(std::string(key) + ": not a node's key under " +
                           std::string(nodes_prefix));
  }
  BATON_RETURN_IF_ERROR(ParseNodeRecord(key, value).status());
  return std::move(*node);
}

std::string RouterReportJson(const proto::RouterReport& report,
                             const std::vector<proto::EngineStalled>& stalls) {
  json engines = json::array();
  for (const proto::EngineOutcome& o : report.engines) {
    engines.push_back({{"engine_id", o.engine_id},
                       {"requests", o.requests},
                       {"errors", o.errors},
                       {"duration_ms", o.duration_ms},
                       {"succeeded", o.succeeded},
                       {"compared", o.compared},
                       {"disagreed", o.disagreed}});
  }
  json j = {{"router", report.router}, {"seq", report.seq}, {"engines", engines}};
  if (!stalls.empty()) {
    json& out = j["stalls"] = json::array();
    for (const proto::EngineStalled& s : stalls) {
      out.push_back({{"engine_id", s.engine_id}, {"streams", s.streams}, {"quiet_ms", s.quiet_ms}});
    }
  }
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

namespace {

// The report's optional "stalls" (none when absent), each with `router`.
Result<std::vector<proto::EngineStalled>> ParseStalls(std::string_view key, const json& j,
                                                      const std::string& router) {
  std::vector<proto::EngineStalled> out;
  auto stalls = j.find("stalls");
  if (stalls == j.end()) return out;
  if (!stalls->is_array()) return InvalidArgument(std::string(key) + ": field 'stalls' is wrong");
  for (const json& e : *stalls) {
    if (!e.is_object()) return InvalidArgument(std::string(key) + ": a stall is not an object");
    proto::EngineStalled s{.router = router};
    BATON_ASSIGN_OR_RETURN(s.engine_id, Field<uint64_t>(key, e, "engine_id"));
    BATON_ASSIGN_OR_RETURN(s.streams, Field<uint32_t>(key, e, "streams"));
    BATON_ASSIGN_OR_RETURN(s.quiet_ms, Field<uint64_t>(key, e, "quiet_ms"));
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace

Result<proto::RouterReport> ParseRouterReport(std::string_view key, std::string_view value) {
  BATON_ASSIGN_OR_RETURN(json j, ParseObject(key, value));
  proto::RouterReport r;
  BATON_ASSIGN_OR_RETURN(r.router, Field<std::string>(key, j, "router"));
  BATON_ASSIGN_OR_RETURN(r.seq, Field<uint64_t>(key, j, "seq"));
  auto engines = j.find("engines");
  if (engines == j.end() || !engines->is_array()) {
    return InvalidArgument(std::string(key) + ": field 'engines' is missing or wrong");
  }
  for (const json& e : *engines) {
    if (!e.is_object()) return InvalidArgument(std::string(key) + ": an engine is not an object");
    proto::EngineOutcome o;
    BATON_ASSIGN_OR_RETURN(o.engine_id, Field<uint64_t>(key, e, "engine_id"));
    BATON_ASSIGN_OR_RETURN(o.requests, Field<uint64_t>(key, e, "requests"));
    BATON_ASSIGN_OR_RETURN(o.errors, Field<uint64_t>(key, e, "errors"));
    BATON_ASSIGN_OR_RETURN(o.duration_ms, Field<uint64_t>(key, e, "duration_ms"));
    BATON_ASSIGN_OR_RETURN(o.succeeded, Field<uint64_t>(key, e, "succeeded"));
    BATON_ASSIGN_OR_RETURN(o.compared, Field<uint64_t>(key, e, "compared"));
    BATON_ASSIGN_OR_RETURN(o.disagreed, Field<uint64_t>(key, e, "disagreed"));
    r.engines.push_back(o);
  }
  return r;
}

Result<std::vector<proto::EngineStalled>> ParseReportStalls(std::string_view key,
                                                            std::string_view value) {
  BATON_ASSIGN_OR_RETURN(json j, ParseObject(key, value));
  BATON_ASSIGN_OR_RETURN(std::string router, Field<std::string>(key, j, "router"));
  return ParseStalls(key, j, router);
}

}  // namespace baton
