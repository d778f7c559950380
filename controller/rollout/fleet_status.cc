#include "controller/rollout/fleet_status.h"

#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "controller/rollout/ctl_rollout.h"
#include "controller/rollout/rollout_record.h"
#include "fleet/fleet_records.h"

namespace baton {
namespace {

using nlohmann::json;

struct Load {
  uint64_t requests = 0;
  uint64_t errors = 0;
};

proto::CtlReply Reply(uint32_t code, std::string text, const json& j) {
  return proto::CtlReply{.exit_code = code,
                         .text = std::move(text),
                         .json = j.dump(-1, ' ', false, json::error_handler_t::replace)};
}

// Per node, what every router reported of its engines (<prefix>reports/<node>/<router>).
std::map<std::string, Load> Loads(EtcdClient& etcd, const std::string& prefix) {
  std::map<std::string, Load> out;
  const std::string reports = prefix + "reports/";
  Result<EtcdRange> range = etcd.GetPrefix(reports);
  if (!range.ok()) return out;
  for (const EtcdKeyValue& kv : range->kvs) {
    if (!std::string_view(kv.key).starts_with(reports)) continue;  // not a report's key
    const std::string rest = kv.key.substr(reports.size());
    const std::string node = rest.substr(0, rest.find('/'));
    Result<proto::RouterReport> r = ParseRouterReport(kv.key, kv.value);
    if (!r.ok()) continue;
    for (const proto::EngineOutcome& o : r->engines) {
      out[node].requests += o.requests;
      out[node].errors += o.errors;
    }
  }
  return out;
}

}  // namespace

proto::CtlReply FleetStatusReply(EtcdClient& etcd, const std::string& prefix) {
  Result<EtcdRange> listed = etcd.GetPrefix(FleetNodesPrefix(prefix));
  if (!listed.ok()) {
    return Reply(
        1, "refused: " + listed.status().message(),
        {{"ok", false}, {"command", "fleet status"}, {"error", listed.status().message()}});
  }
  std::optional<Rollout> rollout;
  if (Result<std::optional<EtcdKeyValue>> kv = etcd.Get(FleetRolloutKey(prefix));
      kv.ok() && kv->has_value()) {
    if (Result<Rollout> r = ParseRolloutRecord((*kv)->value); r.ok()) rollout = std::move(*r);
  }
  const std::map<std::string, Load> loads = Loads(etcd, prefix);
  json nodes = json::array();
  std::ostringstream out;
  out << "fleet " << prefix << ": " << listed->kvs.size() << " nodes\n";
  for (const EtcdKeyValue& kv : listed->kvs) {
    Result<FleetNode> n = ParseNodeRecord(kv.key, kv.value);
    if (!n.ok()) {
      out << "  " << kv.key << ": record does not parse (" << n.status().message() << ")\n";
      nodes.push_back({{"key", kv.key}, {"error", n.status().message()}});
      continue;
    }
    json engines = json::array();
    std::string primary_version;
    out << "  " << n->name << " (" << n->model << "): pair " << n->routes.pair_state;
    for (const proto::RouteEntry& e : n->routes.entries) {
      engines.push_back({{"engine_id", e.engine_id},
                         {"role", proto::ToString(e.role)},
                         {"version", e.engine_version},
                         {"ready", e.ready},
                         {"weight", e.weight}});
      if (e.role == proto::EngineRole::kPrimary) primary_version = e.engine_version;
      out << ", " << proto::ToString(e.role) << " " << e.engine_id << " " << e.engine_version
          << (e.ready ? "" : " (not ready)")
          << (e.weight > 0 && e.weight < 100 ? " at " + std::to_string(e.weight) + " %" : "");
    }
    auto load = loads.find(n->name);
    const Load l = load == loads.end() ? Load{} : load->second;
    out << "; " << l.requests << " requests, " << l.errors << " errors";
    const NodeRollout* in = rollout.has_value() ? rollout->Find(n->name) : nullptr;
    if (in != nullptr) out << "; rollout: " << ToString(in->state);
    out << "\n";
    nodes.push_back({{"node", n->name},
                     {"model", n->model},
                     {"controller_pid", n->controller_pid},
                     {"pair_state", n->routes.pair_state},
                     {"epoch", n->routes.epoch},
                     {"version", primary_version},
                     {"engines", engines},
                     {"requests", l.requests},
                     {"errors", l.errors},
                     {"rollout_state", in == nullptr ? json(nullptr) : json(ToString(in->state))}});
  }
  if (rollout.has_value()) out << RolloutText(*rollout);
  return Reply(0, out.str(),
               {{"ok", true},
                {"prefix", prefix},
                {"nodes", nodes},
                {"rollout", rollout.has_value() ? RolloutJson(*rollout) : json(nullptr)}});
}

}  // namespace baton
