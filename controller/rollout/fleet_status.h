// `batonctl fleet status`: every node of the fleet as etcd lists it (fleet/fleet_records.h):
// its pair's state, each engine's role, version and readiness, the requests and errors the
// fleet's routers counted on the node (its load), and the rollout's entry for it. Reads etcd:
// off the io thread. Plain function.
#pragma once

#include <string>

#include "fleet/etcd_client.h"
#include "proto/messages.h"

namespace baton {

// 0 with the nodes (text: one line per node, then the rollout), 1 when etcd does not answer.
proto::CtlReply FleetStatusReply(EtcdClient& etcd, const std::string& prefix);

}  // namespace baton
