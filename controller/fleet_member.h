// FleetMember: this controller's node in the fleet (docs/fleet.md). When `[fleet] etcd` is
// set, it keeps the node's record under <prefix>nodes/<node> in etcd, under a lease
// (fleet/node_registrar.h), and writes it again with every route table the controller
// publishes. The record is one JSON object:
//
//   {"node": NAME, "model": SERVED_NAME, "controller": {"pid": P, "started_at": UNIX_S},
//    "routes": {"version": V, "epoch": E, "pair_state": S,
//               "entries": [{"engine_id", "role", "http_address", "ready", "weight",
//                            "engine_version"}...]}}
//
// Thread: the controller's io thread; the registrar writes from its own.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "controller/config.h"
#include "fleet/etcd_client.h"
#include "fleet/node_registrar.h"
#include "proto/messages.h"

namespace baton {

class FleetMember {
 public:
  // Null when the config names no etcd.
  static Result<std::unique_ptr<FleetMember>> Create(const ControllerConfig& config);

  // The record for `routes`, written at once when it differs from the last one.
  void Publish(const proto::RouteTable& routes);
  NodeRegistration state() const { return registrar_->state(); }
  const std::string& key() const { return key_; }

  // The etcd client settings of [fleet].
  static EtcdOptions EtcdOptionsOf(const ControllerConfig& config);

  // The record's JSON text (what Publish writes).
  static std::string RecordOf(const ControllerConfig& config, const proto::RouteTable& routes,
                              int64_t pid, int64_t started_at_unix_s);

 private:
  FleetMember(const ControllerConfig& config, std::unique_ptr<EtcdClient> etcd);

  const ControllerConfig& config_;
  const std::string key_;
  const int64_t started_at_unix_s_;
  std::unique_ptr<EtcdClient> etcd_;
  std::unique_ptr<NodeRegistrar> registrar_;
  std::string last_;  // the record published last
};

}  // namespace baton
