#include "controller/fleet_member.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "base/log.h"
#include "fleet/plaintext_etcd.h"

namespace baton {

using nlohmann::json;

std::string WeightsId(const std::vector<CachedTensor>& tensors) {
  uint64_t h = 14695981039346656037ull;
  auto mix = [&h](std::string_view bytes) {
    for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
    h = (h ^ 0xff) * 1099511628211ull;  // a field separator
  };
  for (const CachedTensor& t : tensors) {
    mix(t.name);
    mix(std::to_string(static_cast<int>(t.dtype)));
    for (int64_t d : t.shape) mix(std::to_string(d));
    mix(std::to_string(t.size));
  }
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

FleetMember::FleetMember(const ControllerConfig& config, NodeFacts facts,
                         std::unique_ptr<EtcdClient> etcd)
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
                                   config.fleet_lease_ttl)})),
      facts_(std::move(facts)) {}

Result<std::unique_ptr<FleetMember>> FleetMember::Create(const ControllerConfig& config,
                                                         NodeFacts facts) {
  if (config.fleet_etcd.empty()) return std::unique_ptr<FleetMember>();
  BATON_ASSIGN_OR_RETURN(std::unique_ptr<EtcdClient> etcd,
                         EtcdClient::Create(EtcdOptionsOf(config)));
  BATON_LOG(INFO, "fleet") << "node " << config.fleet_node << " (model " << config.fleet_model
                           << ") registers as " << config.fleet_key() << " in etcd "
                           << config.fleet_etcd.front()
                           << (config.fleet_etcd.size() > 1 ? " and others" : "");
  if (std::vector<std::string> plain =
          PlaintextRemoteEndpoints(config.fleet_etcd, !config.fleet_etcd_ca_file.empty());
      !plain.empty()) {
    BATON_LOG(WARN, "fleet") << PlaintextEtcdWarning(plain);
  }
  return std::unique_ptr<FleetMember>(new FleetMember(config, std::move(facts), std::move(etcd)));
}

EtcdOptions FleetMember::EtcdOptionsOf(const ControllerConfig& config) {
  return {
      .endpoints = config.fleet_etcd,
      .timeout = std::chrono::duration_cast<std::chrono::milliseconds>(config.fleet_etcd_timeout),
      .tls = {.ca_file = config.fleet_etcd_ca_file,
              .cert_file = config.fleet_etcd_cert_file,
              .key_file = config.fleet_etcd_key_file}};
}

std::string FleetMember::RecordOf(const ControllerConfig& config, const NodeFacts& facts,
                                  const NodeLoad& load, const proto::RouteTable& routes,
                                  int64_t pid, int64_t started_at_unix_s) {
  json entries = json::array();
  for (const proto::RouteEntry& e : routes.entries) {
    entries.push_back({{"engine_id", e.engine_id},
                       {"role", proto::ToString(e.role)},
                       {"http_address", e.http_address},
                       {"ready", e.ready},
                       {"weight", e.weight},
                       {"engine_version", e.engine_version}});
  }
  const json record = {
      {"node", config.fleet_node},
      {"model", config.fleet_model},
      {"controller", {{"pid", pid}, {"started_at", started_at_unix_s}}},
      {"weights",
       {{"id", facts.weights_id}, {"tensors", facts.tensors}, {"bytes", facts.tensor_bytes}}},
      {"capacity", {{"pool_blocks", facts.pool_blocks}, {"block_bytes", facts.block_bytes}}},
      {"load", {{"pool_granted_blocks", load.granted_blocks}, {"leases", load.leases}}},
      {"routes",
       {{"version", routes.version},
        {"epoch", routes.epoch},
        {"pair_state", routes.pair_state},
        {"entries", entries}}}};
  return record.dump(-1, ' ', false, json::error_handler_t::replace);
}

void FleetMember::Publish(const proto::RouteTable& routes, const NodeLoad& load,
                          std::chrono::steady_clock::time_point now) {
  routes_ = routes;
  if (load != load_) {
    load_ = load;
    load_written_ = now;
  }
  Write();
}

void FleetMember::NoteLoad(const NodeLoad& load, std::chrono::steady_clock::time_point now) {
  if (load == load_ || now - load_written_ < kLoadInterval) return;
  load_ = load;
  load_written_ = now;
  Write();
}

void FleetMember::Write() {
  if (!routes_.has_value()) return;  // nothing to say before the first route table
  std::string record = RecordOf(config_, facts_, load_, *routes_, ::getpid(), started_at_unix_s_);
  if (record == last_) return;
  last_ = record;
  registrar_->Publish(std::move(record));
}

}  // namespace baton
