// FleetRollout: this controller's part in fleet-wide upgrades (docs/fleet.md, Fleet-wide
// upgrades). Beside the FleetMember of a controller with [fleet], it reads the rollout record
// (<prefix>rollout, rollout_record.h) every `poll`, applies the fleet-level rules
// (AdvanceRollout) and its own node's step (DecideNode, rollout_rules.h): when its node's turn
// comes it starts the node's canary upgrade of the rollout's command, watches its end and
// writes the node's result; asked to go back, it rolls the canary back or upgrades back to
// the previous command. Every write is a compare-and-put on the revision read, so writers on
// other nodes never lose an update; a conflict is read again at once. The rollout's state
// lives in etcd only: a controller that crashes and comes back, or batonctl killed while it
// waits, loses nothing; a controller that cannot reach etcd changes nothing. A step this node
// started (a canary, a way back) whose write was lost (etcd went away, a conflict) is not
// taken again: the next round writes it as started, and a canary that ended meanwhile is
// judged by its end. That memory is the process's: a controller restarted before the write
// gets through starts the step again.
//
// It also runs `batonctl fleet ...` (ctl_rollout.h) off the controller's io thread, since
// etcd calls block: Submit() queues a request and its reply comes through `reply` on this
// object's thread. Logs one line per change it writes.
//
// Ownership: owns its EtcdClient and thread; `local` (the node's upgrades, on the io thread)
// must outlive it. Thread: its own; Submit() and snapshot() from any thread. The destructor
// stops and joins the thread (queued requests are dropped, unanswered).
//
// The rollout's command is whatever the writer of <prefix>rollout chose: before its canary
// starts, the node checks its program against its own configuration (allow_command); a program
// it does not allow fails the node's step, and the rollout stops as for any failed node.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "base/mutex.h"
#include "controller/core/upgrade.h"
#include "controller/rollout/rollout_rules.h"
#include "fleet/etcd_client.h"
#include "fleet/logged_keys.h"
#include "proto/messages.h"

namespace baton {

// The node's own upgrades as the rollout drives them (the controller posts each call to its
// io thread and waits for the answer).
class LocalUpgrades {
 public:
  virtual ~LocalUpgrades() = default;
  virtual Result<LocalUpgrade> View() = 0;
  virtual Status StartUpgrade(UpgradeRequest request) = 0;
  // Rolls the canary in flight back, or upgrades back to the previous command under the
  // canary policy of `overrides` (its command is not used).
  virtual Status StartRollback(UpgradeRequest overrides) = 0;
  // Whether `command` could be launched on this node (its program, placeholders expanded, is
  // an executable file): FailedPrecondition naming the program and why not.
  virtual Status CheckCommand(const std::vector<std::string>& command) = 0;
};

struct FleetRolloutOptions {
  std::string prefix;  // the fleet's, e.g. "/baton/"
  std::string node;    // this node's name
  std::chrono::milliseconds poll{200};
  // Whether this node lets a rollout run `command` (its program against [fleet]
  // rollout_programs, rollout_programs.h). Required. A refusal fails the node's step as any
  // refused step does (AfterRefusedStep): logged once at ERROR, counted in the snapshot; and
  // `batonctl fleet upgrade` asked on this node refuses the command before writing a rollout.
  std::function<Status(const std::vector<std::string>&)> allow_command;
};

class FleetRollout {
 public:
  FleetRollout(std::unique_ptr<EtcdClient> etcd, FleetRolloutOptions options, LocalUpgrades* local);
  ~FleetRollout();
  FleetRollout(const FleetRollout&) = delete;
  FleetRollout& operator=(const FleetRollout&) = delete;

  void Submit(proto::CtlRequest request, std::function<void(proto::CtlReply)> reply);
  RolloutSnapshot snapshot() const;

 private:
  struct Pending {
    proto::CtlRequest request;
    std::function<void(proto::CtlReply)> reply;
  };
  void Run();
  // One reading of the record and what follows; true when it should be read again at once.
  bool Round();
  // The rollout record and its revision; none when etcd fails (Failed), when there is none,
  // or when it does not parse (logged once per revision).
  std::optional<std::pair<Rollout, int64_t>> ReadRecord();
  // `before` advanced: nodes that left, this node's next step (TakeStep) and what its result
  // means for the rollout, for one write. An etcd error when the nodes cannot be listed.
  Result<Rollout> NextRollout(const Rollout& before);
  // Takes this node's step; returns the entry to write (nullopt: nothing).
  std::optional<NodeRollout> TakeStep(const Rollout& rollout, const NodeDecision& decision);
  // The entry after this node refused the rollout's program (`why`): the node fails.
  std::optional<NodeRollout> RefuseProgram(const Rollout& rollout, const NodeDecision& decision,
                                           const Status& why);
  // Marks `mine` (this node's entry in rollout `id`) started when this process started its
  // step and the write saying so was lost.
  void RecallStartedStep(const std::string& id, NodeRollout* mine);
  void Note(const Rollout& rollout);
  void Failed(const Status& status);

  std::unique_ptr<EtcdClient> etcd_;
  const FleetRolloutOptions options_;
  const std::string key_;
  LocalUpgrades* local_;
  mutable Mutex mu_;
  CondVar wake_;
  bool stop_ BATON_GUARDED_BY(mu_) = false;
  std::deque<Pending> requests_ BATON_GUARDED_BY(mu_);
  RolloutSnapshot snapshot_ BATON_GUARDED_BY(mu_);
  bool etcd_down_ BATON_GUARDED_BY(mu_) = false;
  std::string refused_revision_;  // the record that did not parse (logged once)
  std::string refused_program_;   // the rollout whose program this node refused (logged once)
  LoggedKeys left_out_;           // keys under nodes/ that are no node's (ListedFleetNode), logged
  // The last step this node started: the rollout's id and the entry's state then.
  struct StartedStep {
    std::string rollout;
    NodeRolloutState state;
  };
  std::optional<StartedStep> started_;
  std::thread thread_;
};

}  // namespace baton
