#include "controller/rollout/rollout_rules.h"

namespace baton {
namespace {

using NS = NodeRolloutState;
using Step = NodeDecision::Step;

void Move(NodeRollout& n, NS state, std::string reason, int64_t now_ms) {
  n.state = state;
  n.started = false;
  n.reason = std::move(reason);
  n.since_ms = now_ms;
}

// The first node that stopped the rollout (rolled back or failed), if any.
const NodeRollout* Stopper(const Rollout& r) {
  for (const NodeRollout& n : r.nodes) {
    if (n.state == NS::kRolledBack || n.state == NS::kFailed) return &n;
  }
  return nullptr;
}

bool InFlight(const Rollout& r) { return r.Count(NS::kUpgrading) + r.Count(NS::kRollingBack) > 0; }

}  // namespace

bool RolloutEnded(RolloutState s) {
  return s == RolloutState::kDone || s == RolloutState::kRolledBack || s == RolloutState::kFailed ||
         s == RolloutState::kAborted;
}

bool RolloutSettled(const Rollout& r) { return RolloutEnded(r.state) && !InFlight(r); }

std::optional<Rollout> AdvanceRollout(const Rollout& rollout, const std::set<std::string>& listed,
                                      int64_t now_ms) {
  if (RolloutEnded(rollout.state)) return std::nullopt;
  Rollout r = rollout;
  const NodeRollout* stopper = Stopper(r);
  if ((r.state == RolloutState::kRunning || r.state == RolloutState::kPaused) &&
      stopper != nullptr) {
    const std::string why = "node " + stopper->node + " " + ToString(stopper->state) +
                            (stopper->reason.empty() ? "" : ": " + stopper->reason);
    if (r.keep_upgraded) {
      r.state = RolloutState::kFailed;
      r.reason = why + "; the nodes already upgraded keep the new version";
    } else {
      r.state = RolloutState::kRollingBack;
      r.reason = why;
      for (NodeRollout& n : r.nodes) {
        if (n.state == NS::kPromoted || n.state == NS::kUpgrading) {
          Move(n, NS::kRollingBack, "the rollout rolls back: " + why, now_ms);
        }
      }
      if (!InFlight(r)) r.state = RolloutState::kRolledBack;  // nobody to send back
    }
  } else if (r.state == RolloutState::kRollingBack) {
    if (!InFlight(r)) r.state = RolloutState::kRolledBack;
  } else if (r.state == RolloutState::kRunning && r.Count(NS::kUpgrading) == 0) {
    uint32_t started = 0;
    for (NodeRollout& n : r.nodes) {
      if (started == r.batch) break;
      if (n.state != NS::kPending) continue;
      ++started;
      if (listed.count(n.node) == 0) {
        Move(n, NS::kFailed, "not in the fleet when its turn came", now_ms);
      } else {
        Move(n, NS::kUpgrading, "", now_ms);
      }
    }
    if (started == 0 && r.Count(NS::kPromoted) == r.nodes.size()) {
      r.state = RolloutState::kDone;
      r.reason = "every node was promoted";
    }
  }
  if (r == rollout) return std::nullopt;
  r.updated_ms = now_ms;
  return r;
}

NodeDecision DecideNode(const Rollout& r, const std::string& node, const LocalUpgrade& local,
                        int64_t now_ms) {
  const NodeRollout* me = r.Find(node);
  if (me == nullptr || local.recovering) return {};
  NodeDecision d{.step = Step::kNone, .entry = *me};
  NodeRollout& e = d.entry;
  const bool ours =
      local.in_flight && local.kind == UpgradeKind::kUpgrade && local.command == r.command;
  const bool runs_new = local.active == r.command;
  auto record = [&](Step step) {
    d.step = step;
    e.since_ms = now_ms;
    return d;
  };
  if (me->state == NS::kUpgrading) {
    if (local.in_flight) {
      if (ours) {
        if (me->started) return d;
        e.started = true;
        return record(Step::kRecord);
      }
      if (me->started) return d;  // the canary ended and a rollback runs: wait for its end
      Move(e, NS::kFailed,
           "another " + std::string(ToString(local.kind)) + " is in progress on the node", now_ms);
      return record(Step::kRecord);
    }
    if (runs_new) {
      Move(e, NS::kPromoted, "", now_ms);
      e.version = local.last_version;
      return record(Step::kRecord);
    }
    if (me->started) {
      Move(e, NS::kRolledBack,
           local.last_outcome == UpgradeOutcome::kRolledBack && !local.last_reason.empty()
               ? local.last_reason
               : "the canary ended without being promoted",
           now_ms);
      return record(Step::kRecord);
    }
    e.started = true;
    return record(Step::kStartUpgrade);
  }
  if (me->state == NS::kRollingBack) {
    if (local.in_flight) {
      if (ours) {
        if (local.phase == Upgrade::Phase::kRollingBack ||
            local.phase == Upgrade::Phase::kFinishing) {
          return d;
        }
        e.started = true;
        return record(Step::kRollBackCanary);
      }
      if (!me->started && local.kind == UpgradeKind::kRollback) {
        e.started = true;
        return record(Step::kRecord);
      }
      return d;  // the way back (or another upgrade) runs: wait for its end
    }
    if (!runs_new) {
      const std::string why = e.reason;
      Move(e, NS::kRolledBack, why, now_ms);
      e.version.clear();
      return record(Step::kRecord);
    }
    if (me->started) {
      Move(e, NS::kFailed,
           "its way back to the previous command was rolled back" +
               (local.last_reason.empty() ? std::string() : ": " + local.last_reason),
           now_ms);
      return record(Step::kRecord);
    }
    e.started = true;
    return record(Step::kStartRollback);
  }
  return d;
}

std::optional<NodeRollout> AfterRefusedStep(const NodeDecision& d, const Status& why,
                                            int64_t now_ms) {
  if (d.step == Step::kRollBackCanary || d.step == Step::kNone || d.step == Step::kRecord ||
      why.code() == StatusCode::kUnavailable) {
    return std::nullopt;
  }
  NodeRollout e = d.entry;
  Move(e, NS::kFailed,
       std::string(d.step == Step::kStartUpgrade ? "the upgrade was refused: "
                                                 : "the way back was refused: ") +
           why.message(),
       now_ms);
  return e;
}

const char* ToString(NodeDecision::Step step) {
  switch (step) {
    case Step::kNone:
      return "none";
    case Step::kRecord:
      return "record";
    case Step::kStartUpgrade:
      return "start_upgrade";
    case Step::kRollBackCanary:
      return "roll_back_canary";
    case Step::kStartRollback:
      return "start_rollback";
  }
  return "?";
}

}  // namespace baton
