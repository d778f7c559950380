#include "controller/fleet_member.h"

#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "base/log.h"

namespace baton {

using nlohmann::json;

FleetMember::FleetMember(const ControllerConfig& config, std::unique_ptr<EtcdClient> etcd)
    : config_(config),
      key_(config.fleet_key()),
      started_at_unix_s_(std::chrono::duration_cast<std::chrono::seconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count()),
      etcd_(std::move(etcd)),
      registrar_(std::make_unique<NodeRegistrar>(
          etcd_.get(),
          NodeRegistrarOptions{.key = key_,
                               .ttl = std::chrono::duration_cast<std::chrono::milliseconds>(
                                   config.fleet_lease_ttl)})) {}

Result<std::unique_ptr<FleetMember>> FleetMember::Create(const ControllerConfig& config) {
  if (config.fleet_etcd.empty()) return std::unique_ptr<FleetMember>();
  BATON_ASSIGN_OR_RETURN(std::unique_ptr<EtcdClient> etcd,
                         EtcdClient::Create(EtcdOptionsOf(config)));
  BATON_LOG(INFO, "fleet") << "node " << config.fleet_node << " (model " << config.fleet_model
                           << ") registers as " << config.fleet_key() << " in etcd "
                           << config.fleet_etcd.front()
                           << (config.fleet_etcd.size() > 1 ? " and others" : "");
  return std::unique_ptr<FleetMember>(new FleetMember(config, std::move(etcd)));
}

EtcdOptions FleetMember::EtcdOptionsOf(const ControllerConfig& config) {
  return {
      .endpoints = config.fleet_etcd,
      .timeout = std::chrono::duration_cast<std::chrono::milliseconds>(config.fleet_etcd_timeout),
      .tls = {.ca_file = config.fleet_etcd_ca_file,
              .cert_file = config.fleet_etcd_cert_file,
              .key_file = config.fleet_etcd_key_file}};
}

std::string FleetMember::RecordOf(const ControllerConfig& config, const proto::RouteTable& routes,
                                  int64_t pid, int64_t started_at_unix_s) {
  json entries = json::array();
  for (const proto::RouteEntry& e : routes.entries) {
    entries.push_back({{"engine_id", e.engine_id},
                       {"role", e.role},
                       {"http_address", e.http_address},
                       {"ready", e.ready},
                       {"weight", e.weight},
                       {"engine_version", e.engine_version}});
  }
  const json record = {{"node", config.fleet_node},
                       {"model", config.fleet_model},
                       {"controller", {{"pid", pid}, {"started_at", started_at_unix_s}}},
                       {"routes",
                        {{"version", routes.version},
                         {"epoch", routes.epoch},
                         {"pair_state", routes.pair_state},
                         {"entries", entries}}}};
  return record.dump(-1, ' ', false, json::error_handler_t::replace);
}

void FleetMember::Publish(const proto::RouteTable& routes) {
  std::string record = RecordOf(config_, routes, ::getpid(), started_at_unix_s_);
  if (record == last_) return;
  last_ = record;
  registrar_->Publish(std::move(record));
}

}  // namespace baton
