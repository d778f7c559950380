// `batonctl fleet ...` on the controller's side (docs/fleet.md, Fleet-wide upgrades):
//
//   fleet status       every node of the fleet: its pair, engines, versions, the requests the
//                      routers counted on it, and the rollout
//   fleet rollout      the rollout record (rollout_record.h)
//   fleet upgrade [--batch N | --fraction F] [--keep-upgraded] [--wait]
//                 [--steps 10,50,100] [--step-ms N] [--min-requests N] -- CMD ARGS...
//                      starts a rollout of CMD over every node listed now, N nodes (or
//                      ceil(F x nodes)) at a time, each through its own canary judge; with
//                      --keep-upgraded a rollback on one node stops the rollout without
//                      rolling back the nodes already upgraded. --wait is batonctl's: it
//                      polls `fleet rollout` until the rollout settles.
//   fleet pause | resume | abort
//                      no new batch starts / they start again / the rollout stops and the
//                      canaries in flight are rolled back (nodes already promoted stay)
// Each reads and writes etcd (every write a compare-and-put, retried on a conflict): run off
// the io thread (FleetRollout). Replies follow HandleCtlRequest's: 0 done, 1 refused, 2 bad usage,
// one JSON object. Plain functions.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "controller/core/upgrade.h"
#include "controller/rollout/rollout_record.h"
#include "fleet/etcd_client.h"
#include "proto/messages.h"

namespace baton {

struct FleetCtlContext {
  EtcdClient* etcd = nullptr;
  std::string prefix;
  std::string node;  // the controller's own
  // Whether an engine command could be launched on this node (LocalUpgrades::CheckCommand:
  // the check of `batonctl upgrade`); `fleet upgrade` refuses a command it refuses before
  // writing the rollout. Null: not checked.
  std::function<Status(const std::vector<std::string>&)> check_command = nullptr;
};

struct FleetUpgradeArgs {
  UpgradeRequest request;
  std::optional<uint32_t> batch;
  std::optional<double> fraction;
  bool keep_upgraded = false;
  bool wait = false;
};

// `fleet upgrade`'s arguments (after "upgrade"); InvalidArgument names what is wrong.
Result<FleetUpgradeArgs> ParseFleetUpgradeArgs(const std::vector<std::string>& args);
// A new rollout's id: "rollout-<created_ms>-<node>-<8 random hex digits>", so that two
// batonctl started in the same millisecond, on one node or two, never make the same one.
Result<std::string> NewRolloutId(int64_t created_ms, const std::string& node);
// Writes `rollout`, a new one, under <prefix>rollout by compare-and-put on `revision` (the
// record's revision when `fleet upgrade` read it; 0: none). A conflict is read again: the
// write counts as done when the record there is byte for byte this one (a write retried on another
// etcd member, applied by its first try); another writer's record is FailedPrecondition ("the
// rollout record changed meanwhile (another batonctl?)"). Public for tests.
Status PutNewRollout(const FleetCtlContext& ctx, const Rollout& rollout, int64_t revision);
// The whole `fleet` command line (after "fleet"), as batonctl checks it before asking.
Status CheckFleetArgs(const std::vector<std::string>& args);

proto::CtlReply HandleFleetCommand(const FleetCtlContext& ctx,
                                   const std::vector<std::string>& args);

// The rollout as `fleet rollout` prints it: a line, then one per node.
std::string RolloutText(const Rollout& rollout);

}  // namespace baton
