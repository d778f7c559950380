// The rules of a fleet-wide upgrade (docs/fleet.md, Fleet-wide upgrades), as pure functions of
// the rollout record (rollout_record.h) and what one node sees, so that every controller
// decides alike and the rules are tested without etcd or processes.
//
// The rollout as a whole (AdvanceRollout, which any controller may apply):
//   * running, no node upgrading: the next `batch` pending nodes start upgrading, in the
//     record's order; a node whose record is not in the fleet when its turn comes fails
//     ("not in the fleet"). No node left pending and every node promoted: done.
//   * running or paused, a node rolled back or failed: the rollout stops. Unless
//     keep_upgraded, it rolls back: every node promoted or upgrading goes rolling_back, and
//     once none is rolling back the rollout is rolled_back; with keep_upgraded, the nodes in
//     flight finish, nobody goes back, and the rollout ends failed.
//   * paused: no new batch starts; the nodes in flight finish.
//   * aborted (an operator's abort): no node starts again; nodes rolling back finish.
// A rollout is settled when its state is an end (done, rolled_back, failed, aborted) and no
// node is upgrading or rolling back: `batonctl fleet upgrade --wait` waits for that.
//
// One node's part (DecideNode, which only that node's controller applies), from its entry and
// its local upgrade (controller/core/upgrade.h) as its coordinator reports it:
//   * upgrading: start the canary of the rollout's command (once); its end is read from the
//     command standbys are launched with: the rollout's command means promoted, anything
//     else after it started means rolled back (with the judge's reason);
//   * rolling_back: a canary of the rollout's command in flight is rolled back; a node that
//     runs the rollout's command upgrades back to the previous one (`batonctl rollback`);
//     it is rolled_back once it runs another command; failed when its way back was itself
//     rolled back.
// Plain functions; thread-compatible.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "controller/core/upgrade.h"
#include "controller/rollout/rollout_record.h"

namespace baton {

// Whether the rollout's state is an end, whatever its nodes do.
bool RolloutEnded(RolloutState state);
// Ended, and no node upgrading or rolling back.
bool RolloutSettled(const Rollout& rollout);

// The record as the fleet-level rules make it next, at `now_ms`; nullopt when they change
// nothing. `listed`: the nodes whose records are in the fleet now.
std::optional<Rollout> AdvanceRollout(const Rollout& rollout, const std::set<std::string>& listed,
                                      int64_t now_ms);

// What a node's controller reports of its own upgrades.
struct LocalUpgrade {
  // A restarted controller still re-adopts its engines: the upgrade it resumes is not known
  // yet, so nothing is decided.
  bool recovering = false;
  bool in_flight = false;
  UpgradeKind kind = UpgradeKind::kUpgrade;           // of the one in flight
  Upgrade::Phase phase = Upgrade::Phase::kLaunching;  // of the one in flight
  std::vector<std::string> command = {};              // of the one in flight
  std::vector<std::string> active = {};               // the command standbys are launched with now
  std::optional<UpgradeOutcome> last_outcome = {};    // of the last ended upgrade, if any
  std::string last_reason = {};
  std::string last_version = {};
};

struct NodeDecision {
  enum class Step {
    kNone,            // nothing to do now
    kRecord,          // write `entry` (no local action)
    kStartUpgrade,    // start the canary of the rollout's command; then write `entry`
    kRollBackCanary,  // roll the canary in flight back; then write `entry`
    kStartRollback,   // upgrade back to the previous command; then write `entry`
  };
  Step step = Step::kNone;
  NodeRollout entry = {};  // the entry once the step is done
};

// `node`'s step in `rollout` (nodes not in it, or recovering: none).
NodeDecision DecideNode(const Rollout& rollout, const std::string& node, const LocalUpgrade& local,
                        int64_t now_ms);

// The entry after a step the node tried and could not do (`why`): upgrading or rolling back,
// the node fails. nullopt (nothing written: the step is tried again at the next round) for a
// refusal that passes (Unavailable: the pair is not ready yet, the controller is busy) and for
// a canary's rollback (kRollBackCanary), which a canary already taking over refuses a while.
std::optional<NodeRollout> AfterRefusedStep(const NodeDecision& decision, const Status& why,
                                            int64_t now_ms);

const char* ToString(NodeDecision::Step step);

}  // namespace baton
