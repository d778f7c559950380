#include "controller/rollout/fleet_rollout.h"

#include <set>
#include <utility>

#include "base/check.h"
#include "base/log.h"
#include "controller/rollout/ctl_rollout.h"
#include "fleet/fleet_records.h"

namespace baton {
namespace {

constexpr const char* kLog = "rollout";

UpgradeRequest RequestOf(const Rollout& r) {
  UpgradeRequest req;
  req.command = r.command;
  if (!r.steps.empty()) req.steps = r.steps;
  if (r.step_ms > 0) req.step_duration = std::chrono::milliseconds(r.step_ms);
  if (r.min_requests > 0) req.min_requests = r.min_requests;
  return req;
}

// One line per change between `before` and `after` (the rollout, then each node).
void LogChanges(const Rollout* before, const Rollout& after, const std::string& writer) {
  if (before == nullptr || before->id != after.id) {
    BATON_LOG(INFO, kLog) << "rollout " << after.id << " " << ToString(after.state) << " over "
                          << after.nodes.size() << " nodes, " << after.batch
                          << " at a time: " << Joined(after.command) << " (written by " << writer
                          << ")";
  } else if (before->state != after.state) {
    BATON_LOG(INFO, kLog) << "rollout " << after.id << ": " << ToString(before->state) << " -> "
                          << ToString(after.state)
                          << (after.reason.empty() ? "" : " (" + after.reason + ")")
                          << " (written by " << writer << ")";
  }
  for (const NodeRollout& n : after.nodes) {
    const NodeRollout* was = before == nullptr ? nullptr : before->Find(n.node);
    if (was != nullptr && was->state == n.state) continue;
    if (was == nullptr && n.state == NodeRolloutState::kPending) continue;
    BATON_LOG(INFO, kLog) << "rollout " << after.id << ": node " << n.node << " "
                          << (was == nullptr ? "" : std::string(ToString(was->state)) + " -> ")
                          << ToString(n.state) << (n.reason.empty() ? "" : " (" + n.reason + ")")
                          << " (written by " << writer << ")";
  }
}

// `options` as given, once known to be usable (before the thread that reads them starts).
FleetRolloutOptions Checked(FleetRolloutOptions options) {
  BATON_CHECK(options.allow_command != nullptr);
  return options;
}

}  // namespace

FleetRollout::FleetRollout(std::unique_ptr<EtcdClient> etcd, FleetRolloutOptions options,
                           LocalUpgrades* local)
    : etcd_(std::move(etcd)),
      options_(Checked(std::move(options))),
      key_(FleetRolloutKey(options_.prefix)),
      local_(local),
      thread_([this] { Run(); }) {}

FleetRollout::~FleetRollout() {
  {
    MutexLock lock(mu_);
    stop_ = true;
  }
  wake_.NotifyAll();
  thread_.join();
}

void FleetRollout::Submit(proto::CtlRequest request, std::function<void(proto::CtlReply)> reply) {
  {
    MutexLock lock(mu_);
    requests_.push_back({std::move(request), std::move(reply)});
  }
  wake_.NotifyAll();
}

RolloutSnapshot FleetRollout::snapshot() const {
  MutexLock lock(mu_);
  return snapshot_;
}

void FleetRollout::Run() {
  bool again = false;
  for (;;) {
    std::deque<Pending> requests;
    {
      MutexLock lock(mu_);
      if (!again) {
        const auto deadline = std::chrono::steady_clock::now() + options_.poll;
        while (!stop_ && requests_.empty()) {
          if (wake_.WaitUntil(mu_, deadline) == std::cv_status::timeout) break;
        }
      }
      if (stop_) return;
      requests.swap(requests_);
    }
    for (Pending& p : requests) {
      const FleetCtlContext ctx{.etcd = etcd_.get(),
                                .prefix = options_.prefix,
                                .node = options_.node,
                                .check_command = [this](const std::vector<std::string>& command) {
                                  BATON_RETURN_IF_ERROR(local_->CheckCommand(command));
                                  return options_.allow_command(command);
                                }};
      p.reply(HandleFleetCommand(ctx, p.request.args));
    }
    again = Round();
  }
}

void FleetRollout::Failed(const Status& status) {
  MutexLock lock(mu_);
  ++snapshot_.etcd_failures;
  snapshot_.last_error = status.message();
  if (!etcd_down_) {
    etcd_down_ = true;
    BATON_LOG(WARN, kLog) << "cannot read the rollout in etcd: " << status.message()
                          << "; nothing changes until etcd answers";
  }
}

void FleetRollout::Note(const Rollout& r) {
  MutexLock lock(mu_);
  snapshot_.seen = true;
  snapshot_.id = r.id;
  snapshot_.state = r.state;
  snapshot_.settled = RolloutSettled(r);
  const NodeRollout* me = r.Find(options_.node);
  snapshot_.node_state = me == nullptr ? std::nullopt : std::optional(me->state);
  for (size_t& n : snapshot_.nodes) n = 0;
  for (const NodeRollout& n : r.nodes) ++snapshot_.nodes[static_cast<int>(n.state)];
}

bool FleetRollout::Round() {
  std::optional<std::pair<Rollout, int64_t>> read = ReadRecord();
  if (!read.has_value()) return false;
  const Rollout& before = read->first;
  Note(before);
  if (RolloutSettled(before)) return false;
  Result<Rollout> next = NextRollout(before);
  if (!next.ok()) {
    Failed(next.status());
    return false;
  }
  if (*next == before) return false;
  Result<std::optional<int64_t>> put =
      etcd_->CompareAndPut(key_, RolloutRecord(*next), read->second);
  if (!put.ok()) {
    Failed(put.status());
    return false;
  }
  MutexLock lock(mu_);
  if (!put->has_value()) {
    ++snapshot_.conflicts;
    return true;  // someone wrote meanwhile: read it again
  }
  ++snapshot_.writes;
  LogChanges(&before, *next, options_.node);
  return true;
}

std::optional<std::pair<Rollout, int64_t>> FleetRollout::ReadRecord() {
  Result<std::optional<EtcdKeyValue>> kv = etcd_->Get(key_);
  if (!kv.ok()) {
    Failed(kv.status());
    return std::nullopt;
  }
  {
    MutexLock lock(mu_);
    if (etcd_down_) {
      BATON_LOG(INFO, kLog) << "etcd answers again";
      etcd_down_ = false;
      snapshot_.last_error.clear();
    }
  }
  if (!kv->has_value()) return std::nullopt;
  Result<Rollout> read = ParseRolloutRecord((*kv)->value);
  if (!read.ok()) {
    const std::string revision = std::to_string((*kv)->mod_revision);
    if (refused_revision_ != revision) {
      refused_revision_ = revision;
      BATON_LOG(WARN, kLog) << key_ << " skipped: " << read.status().message();
    }
    return std::nullopt;
  }
  return std::make_pair(std::move(read).value(), (*kv)->mod_revision);
}

Result<Rollout> FleetRollout::NextRollout(const Rollout& before) {
  const int64_t now = UnixMillisNow();
  Rollout next = before;
  std::set<std::string> listed;
  if (!RolloutEnded(before.state)) {
    BATON_ASSIGN_OR_RETURN(EtcdRange nodes, etcd_->GetPrefix(FleetNodesPrefix(options_.prefix)));
    const std::string nodes_prefix = FleetNodesPrefix(options_.prefix);
    for (const EtcdKeyValue& n : nodes.kvs) {
      Result<std::string> node = ListedFleetNode(nodes_prefix, n.key, n.value);
      if (node.ok()) {
        listed.insert(std::move(*node));
      } else if (left_out_.First(n.key, n.mod_revision)) {
        BATON_LOG(WARN, kLog) << "not a node of the rollout: " << node.status().message();
      }
    }
    left_out_.EndReading();
    if (std::optional<Rollout> advanced = AdvanceRollout(before, listed, now)) {
      next = std::move(*advanced);
    }
  }
  NodeRollout* mine = next.Find(options_.node);
  if (mine == nullptr) return next;
  RecallStartedStep(next.id, mine);
  Result<LocalUpgrade> local = local_->View();
  if (!local.ok()) return next;
  const NodeDecision d = DecideNode(next, options_.node, *local, now);
  if (std::optional<NodeRollout> entry = TakeStep(next, d)) {
    *next.Find(options_.node) = std::move(*entry);
    next.updated_ms = now;
    // What this node's result means for the rollout goes in the same write.
    if (std::optional<Rollout> advanced = AdvanceRollout(next, listed, now)) {
      next = std::move(*advanced);
    }
  }
  return next;
}

void FleetRollout::RecallStartedStep(const std::string& id, NodeRollout* mine) {
  if (!started_.has_value() || started_->rollout != id || started_->state != mine->state ||
      mine->started) {
    return;
  }
  mine->started = true;
  BATON_LOG(INFO, kLog) << "rollout " << id << ": node " << options_.node << " started its "
                        << ToString(mine->state)
                        << " step before the record could say so: recorded now, not taken again";
}

std::optional<NodeRollout> FleetRollout::RefuseProgram(const Rollout& r, const NodeDecision& d,
                                                       const Status& why) {
  const bool first = refused_program_ != r.id;  // a step retried (etcd's CAS) counts once
  {
    MutexLock lock(mu_);
    snapshot_.refused_programs += first ? 1 : 0;
    snapshot_.refused_rollout = r.id;
    snapshot_.refused_program = why.message();
  }
  if (first) {
    refused_program_ = r.id;
    BATON_LOG(ERROR, kLog) << "rollout " << r.id << ": node " << options_.node << " refuses to run "
                           << Joined(r.command) << ": " << why.message();
  }
  return AfterRefusedStep(d, why, UnixMillisNow());
}

std::optional<NodeRollout> FleetRollout::TakeStep(const Rollout& r, const NodeDecision& d) {
  using Step = NodeDecision::Step;
  Status done = OkStatus();
  switch (d.step) {
    case Step::kNone:
      return std::nullopt;
    case Step::kRecord:
      return d.entry;
    case Step::kStartUpgrade:
      if (Status allowed = options_.allow_command(r.command); !allowed.ok()) {
        return RefuseProgram(r, d, allowed);
      }
      BATON_LOG(INFO, kLog) << "rollout " << r.id << ": node " << options_.node
                            << " starts its canary of " << Joined(r.command);
      done = local_->StartUpgrade(RequestOf(r));
      break;
    case Step::kRollBackCanary:
    case Step::kStartRollback:
      BATON_LOG(INFO, kLog) << "rollout " << r.id << ": node " << options_.node
                            << (d.step == Step::kRollBackCanary
                                    ? " rolls its canary back"
                                    : " upgrades back to its previous command");
      done = local_->StartRollback(RequestOf(r));
      break;
  }
  {
    MutexLock lock(mu_);
    ++snapshot_.steps;
  }
  if (done.ok()) {
    started_ = StartedStep{.rollout = r.id, .state = d.entry.state};
    return d.entry;
  }
  BATON_LOG(WARN, kLog) << "rollout " << r.id << ": node " << options_.node << " "
                        << ToString(d.step) << " refused: " << done.message();
  return AfterRefusedStep(d, done, UnixMillisNow());
}

}  // namespace baton
