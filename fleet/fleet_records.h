// The fleet's records in etcd, read and written as JSON (docs/fleet.md, Keys):
//
//   <prefix>nodes/<node>             a node's record (controller/fleet_member.h), under the
//                                    node's lease
//   <prefix>reports/<node>/<router>  what one router saw of that node's engines (the
//                                    RouterReport a router on the node's own socket sends),
//                                    under the router's lease:
//     {"router": NAME, "seq": N, "engines": [{"engine_id", "requests", "errors",
//      "duration_ms", "succeeded", "compared", "disagreed"}...],
//      "stalls": [{"engine_id", "streams", "quiet_ms"}...]}
//   "stalls" (the EngineStalled a router on the node's socket sends) is left out when the
//   router finds no engine of the node stalled; a report without it has none.
//
// A record that does not parse, or lacks a field, is refused with InvalidArgument naming the
// key and the field; unknown fields are ignored (a newer controller may add some).
// Plain functions; thread-compatible.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "proto/messages.h"

namespace baton {

// A node as its record describes it.
struct FleetNode {
  std::string name = {};
  std::string model = {};
  int64_t controller_pid = 0;
  int64_t controller_started_at = 0;
  proto::RouteTable routes = {};
  std::string weights_id = {};  // "" when the record has none
  uint64_t pool_blocks = 0;     // the record's capacity; 0 when it has none
  uint64_t pool_granted_blocks = 0;
  // Granted over total pool blocks, in [0, 1]; 0 when the record carries no capacity.
  double Load() const {
    return pool_blocks == 0 ? 0
                            : std::min(1.0, static_cast<double>(pool_granted_blocks) /
                                                static_cast<double>(pool_blocks));
  }
};

// The node of `key` (<prefix>nodes/<node>) from its record `value`; refused when the record's
// "node" is not the key's last part.
Result<FleetNode> ParseNodeRecord(std::string_view key, std::string_view value);

std::string FleetNodesPrefix(const std::string& prefix);  // <prefix>nodes/
// The node of `key` when it is <nodes_prefix><node> (`nodes_prefix` as FleetNodesPrefix makes
// it); nullopt for a key outside the prefix (an answer no etcd should give), or with no node
// or a '/' after it.
std::optional<std::string> FleetNodeOfKey(std::string_view nodes_prefix, std::string_view key);
// The node that `key` lists with its record `value`: FleetNodeOfKey's, when the record parses
// and names that node (ParseNodeRecord). InvalidArgument naming the key otherwise. Only such
// keys count as the fleet's nodes (a rollout's nodes, its nodes that left): a key no
// controller writes would be a node no controller acts for.
Result<std::string> ListedFleetNode(std::string_view nodes_prefix, std::string_view key,
                                    std::string_view value);
// <prefix>reports/<node>/ and <prefix>reports/<node>/<router>.
std::string FleetReportsPrefix(const std::string& prefix, const std::string& node);
std::string FleetReportKey(const std::string& prefix, const std::string& node,
                           const std::string& router);

// The report, with `stalls` (their `router` is not written: it is the report's).
std::string RouterReportJson(const proto::RouterReport& report,
                             const std::vector<proto::EngineStalled>& stalls = {});
// The report of `key` (its stalls aside, as a reader older than them reads it).
Result<proto::RouterReport> ParseRouterReport(std::string_view key, std::string_view value);
// The stalls of the report of `key` (none when it has no "stalls"), each with `router` set to
// the report's. Apart from ParseRouterReport, so that stalls a reader cannot read cost it
// no outcome.
Result<std::vector<proto::EngineStalled>> ParseReportStalls(std::string_view key,
                                                            std::string_view value);

}  // namespace baton
