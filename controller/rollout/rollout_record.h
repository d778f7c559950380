// The fleet's rollout record: one engine-version upgrade rolled across the nodes of a fleet
// (docs/fleet.md, Fleet-wide upgrades), kept in etcd under <prefix>rollout as one JSON object
// so that every controller and every batonctl sees the same rollout, and a crashed writer
// loses nothing:
//
//   {"id": "rollout-1796200000123-node-a-5e0b91d2", "command": ["ENGINE", "ARG"...], "batch": 1,
//    "fraction": 0, "keep_upgraded": false, "steps": [50, 100], "step_ms": 300,
//    "min_requests": 5, "state": "running", "reason": "", "started_by": "node-a",
//    "created_ms": UNIX_MS, "updated_ms": UNIX_MS,
//    "nodes": [{"node": "node-a", "state": "promoted", "started": true, "reason": "",
//               "version": "refengine-v2", "since_ms": UNIX_MS}...]}
//
// The record is only ever written with a compare-and-put on the revision it was read at
// (EtcdClient::CompareAndPut), so two writers never lose each other's update: the loser reads
// again and decides anew. Nodes upgrade in the order of `nodes`.
//
// A record that does not parse, or lacks a field, is refused with InvalidArgument naming the
// field; unknown fields are ignored. Plain values and functions; thread-compatible.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace baton {

enum class RolloutState {
  kRunning,      // nodes are upgraded batch after batch
  kPaused,       // no new batch starts; the nodes in flight finish
  kRollingBack,  // a node was rolled back: the nodes already upgraded go back
  kDone,         // every node was promoted
  kRolledBack,   // stopped by a node's rollback; the upgraded nodes went back
  kFailed,       // stopped by a node's rollback; the upgraded nodes kept the new version
  kAborted,      // stopped by an operator; canaries in flight were rolled back
};

enum class NodeRolloutState {
  kPending,      // its turn has not come
  kUpgrading,    // its controller runs the canary upgrade
  kPromoted,     // the canary was promoted: the node runs the new command
  kRollingBack,  // asked to go back: its canary is rolled back, or it upgrades back
  kRolledBack,   // it runs the previous command again (its canary failed, or it went back)
  kFailed,       // the upgrade or the way back could not be done (reason says why)
};

const char* ToString(RolloutState state);
const char* ToString(NodeRolloutState state);
std::optional<RolloutState> ParseRolloutState(std::string_view text);
std::optional<NodeRolloutState> ParseNodeRolloutState(std::string_view text);

struct NodeRollout {
  std::string node = {};
  NodeRolloutState state = NodeRolloutState::kPending;
  // The node's controller started what its state asks for (upgrading: its canary; rolling
  // back: the canary's rollback or the upgrade back to the previous command).
  bool started = false;
  std::string reason = {};
  std::string version = {};  // what the promoted engine reports
  int64_t since_ms = 0;      // when the state last changed (Unix ms)
  bool operator==(const NodeRollout&) const = default;
};

struct Rollout {
  std::string id = {};
  std::vector<std::string> command = {};
  uint32_t batch = 1;   // nodes upgraded at a time
  double fraction = 0;  // > 0: batch came from --fraction (ceil(fraction x nodes))
  bool keep_upgraded = false;
  // The canary policy's overrides for every node (empty / 0: each node's [upgrade] config).
  std::vector<uint32_t> steps = {};
  uint64_t step_ms = 0;
  uint64_t min_requests = 0;
  RolloutState state = RolloutState::kRunning;
  std::string reason = {};  // why it stopped, rolls back or was paused
  std::string started_by = {};
  int64_t created_ms = 0;
  int64_t updated_ms = 0;
  std::vector<NodeRollout> nodes = {};
  bool operator==(const Rollout&) const = default;

  NodeRollout* Find(std::string_view node);
  const NodeRollout* Find(std::string_view node) const;
  size_t Count(NodeRolloutState state) const;
};

// What status and metrics show of the rollout, as this node saw it last.
struct RolloutSnapshot {
  bool seen = false;  // a rollout record was read
  std::string id;
  RolloutState state = RolloutState::kRunning;
  bool settled = false;
  std::optional<NodeRolloutState> node_state;  // this node's (nullopt: not in the rollout)
  size_t nodes[6] = {};                        // nodes by NodeRolloutState
  uint64_t writes = 0;                         // records this node wrote
  uint64_t conflicts = 0;                      // compare-and-puts that found the record moved on
  uint64_t etcd_failures = 0;
  uint64_t steps = 0;  // local steps taken (canaries started, rolled back, ways back)
  // Rollouts whose program this node refused (rollout_programs.h), and the last refusal.
  uint64_t refused_programs = 0;
  std::string refused_rollout;  // its id
  std::string refused_program;  // why
  std::string last_error;
};

// <prefix>rollout.
std::string FleetRolloutKey(const std::string& prefix);

nlohmann::json RolloutJson(const Rollout& rollout);
std::string RolloutRecord(const Rollout& rollout);  // RolloutJson as text
Result<Rollout> ParseRolloutRecord(std::string_view value);

// ceil(fraction x nodes), at least 1 and at most `nodes` (nodes 0: 1).
uint32_t BatchOfFraction(double fraction, size_t nodes);

// Unix time in ms now (the record's clock: wall time, comparable across nodes).
int64_t UnixMillisNow();

}  // namespace baton
