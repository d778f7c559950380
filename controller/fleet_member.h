// FleetMember: this controller's node in the fleet (docs/fleet.md). When `[fleet] etcd` is
// set, it keeps the node's record under <prefix>nodes/<node> in etcd, under a lease
// (fleet/node_registrar.h), and writes it again with every route table the controller
// publishes. The record is one JSON object:
//
//   {"node": NAME, "model": SERVED_NAME, "controller": {"pid": P, "started_at": UNIX_S},
//    "weights": {"id": HEX16, "tensors": N, "bytes": B},
//    "capacity": {"pool_blocks": N, "block_bytes": B},
//    "load": {"pool_granted_blocks": G, "leases": L},
//    "routes": {"version": V, "epoch": E, "pair_state": S,
//               "entries": [{"engine_id", "role", "http_address", "ready", "weight",
//                            "engine_version"}...]}}
//
// The weights id is a hash of the tensor table (names, dtypes, shapes, sizes): nodes that
// loaded the same model show the same id. The load is written again when it changed, at
// most once per kLoadInterval; a route change is written at once, with the load of then (a
// record that listed a new primary with the load from before its grant would draw every
// router's requests to this node until the next load report).
//
// Thread: the controller's io thread; the registrar writes from its own.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "controller/config.h"
#include "fleet/etcd_client.h"
#include "fleet/node_registrar.h"
#include "proto/messages.h"
#include "weightcache/weight_manifest.h"

namespace baton {

// What a node offers, fixed once its memory is set up.
struct NodeFacts {
  std::string weights_id = {};
  uint64_t tensors = 0;
  uint64_t tensor_bytes = 0;
  uint64_t pool_blocks = 0;
  uint64_t block_bytes = 0;
};

// How much of it is in use now.
struct NodeLoad {
  uint64_t granted_blocks = 0;
  uint64_t leases = 0;
  bool operator==(const NodeLoad&) const = default;
};

// The weights id of NodeFacts: 16 hex digits of a 64-bit FNV-1a hash of the tensor table.
std::string WeightsId(const std::vector<CachedTensor>& tensors);

class FleetMember {
 public:
  // Null when the config names no etcd.
  static Result<std::unique_ptr<FleetMember>> Create(const ControllerConfig& config,
                                                     NodeFacts facts);

  static constexpr std::chrono::milliseconds kLoadInterval{1000};

  // The record for `routes` and the load now, written at once when it differs from the last
  // one.
  void Publish(const proto::RouteTable& routes, const NodeLoad& load,
               std::chrono::steady_clock::time_point now);
  // The load now; the record is written again when it changed and kLoadInterval has passed
  // since the load was last written.
  void NoteLoad(const NodeLoad& load, std::chrono::steady_clock::time_point now);
  NodeRegistration state() const { return registrar_->state(); }
  const std::string& key() const { return key_; }

  // The etcd client settings of [fleet].
  static EtcdOptions EtcdOptionsOf(const ControllerConfig& config);

  // The record's JSON text (what Publish writes).
  static std::string RecordOf(const ControllerConfig& config, const NodeFacts& facts,
                              const NodeLoad& load, const proto::RouteTable& routes, int64_t pid,
                              int64_t started_at_unix_s);

 private:
  FleetMember(const ControllerConfig& config, NodeFacts facts, std::unique_ptr<EtcdClient> etcd);
  void Write();

  const ControllerConfig& config_;
  const std::string key_;
  const int64_t started_at_unix_s_;
  std::unique_ptr<EtcdClient> etcd_;
  std::unique_ptr<NodeRegistrar> registrar_;
  const NodeFacts facts_;
  NodeLoad load_;  // the load written last
  std::chrono::steady_clock::time_point load_written_;
  std::optional<proto::RouteTable> routes_;  // the route table published last
  std::string last_;                         // the record written last
};

}  // namespace baton
