// The rules of a fleet-wide upgrade (controller/rollout/rollout_rules.h) and its record
// (rollout_record.h), without etcd or processes: batches of one node or of a fraction, a
// rollback anywhere stopping the rollout and sending the upgraded nodes back (or keeping them),
// pause and abort, and each node's steps from what its coordinator reports.
#include "controller/rollout/rollout_rules.h"

#include <gtest/gtest.h>

#include "controller/rollout/rollout_record.h"

namespace baton {
namespace {

using NS = NodeRolloutState;
using Step = NodeDecision::Step;

const std::vector<std::string> kNew = {"engine", "--version", "2"};
const std::vector<std::string> kOld = {"engine", "--version", "1"};
const std::set<std::string> kAll = {"a", "b", "c", "d"};

Rollout Fresh(uint32_t batch = 1, size_t nodes = 3) {
  Rollout r;
  r.id = "rollout-1";
  r.command = kNew;
  r.batch = batch;
  for (size_t i = 0; i < nodes; ++i) r.nodes.push_back({.node = std::string(1, 'a' + i)});
  return r;
}

NS StateOf(const Rollout& r, const std::string& node) { return r.Find(node)->state; }

// Applies AdvanceRollout when it changes something.
Rollout Advance(const Rollout& r, const std::set<std::string>& listed = kAll) {
  std::optional<Rollout> next = AdvanceRollout(r, listed, 100);
  return next.has_value() ? *next : r;
}

LocalUpgrade Idle(const std::vector<std::string>& active) { return LocalUpgrade{.active = active}; }

LocalUpgrade Canary(Upgrade::Phase phase = Upgrade::Phase::kCanary) {
  return LocalUpgrade{.in_flight = true,
                      .kind = UpgradeKind::kUpgrade,
                      .phase = phase,
                      .command = kNew,
                      .active = kOld};
}

TEST(RolloutRules, OneNodeAtATimeInTheRecordsOrderUntilDone) {
  Rollout r = Advance(Fresh());
  EXPECT_EQ(StateOf(r, "a"), NS::kUpgrading);
  EXPECT_EQ(StateOf(r, "b"), NS::kPending);
  EXPECT_FALSE(AdvanceRollout(r, kAll, 200).has_value()) << "a upgrades: nothing else starts";
  r.Find("a")->state = NS::kPromoted;
  r = Advance(r);
  EXPECT_EQ(StateOf(r, "b"), NS::kUpgrading);
  EXPECT_EQ(StateOf(r, "c"), NS::kPending);
  r.Find("b")->state = NS::kPromoted;
  r = Advance(r);
  r.Find("c")->state = NS::kPromoted;
  r = Advance(r);
  EXPECT_EQ(r.state, RolloutState::kDone);
  EXPECT_TRUE(RolloutSettled(r));
  EXPECT_FALSE(AdvanceRollout(r, kAll, 300).has_value()) << "an end is an end";
}

TEST(RolloutRules, AFractionStartsItsBatchTogether) {
  EXPECT_EQ(BatchOfFraction(0.5, 4), 2u);
  EXPECT_EQ(BatchOfFraction(0.34, 3), 2u);
  EXPECT_EQ(BatchOfFraction(0.01, 3), 1u);
  EXPECT_EQ(BatchOfFraction(1.0, 3), 3u);
  EXPECT_EQ(BatchOfFraction(0.3, 10), 3u) << "no rounding up of 0.3 x 10 to 4";
  Rollout r = Advance(Fresh(BatchOfFraction(0.5, 4), 4));
  EXPECT_EQ(r.Count(NS::kUpgrading), 2u);
  r.Find("a")->state = NS::kPromoted;
  EXPECT_FALSE(AdvanceRollout(r, kAll, 200).has_value()) << "the batch finishes first";
  r.Find("b")->state = NS::kPromoted;
  r = Advance(r);
  EXPECT_EQ(StateOf(r, "c"), NS::kUpgrading);
  EXPECT_EQ(StateOf(r, "d"), NS::kUpgrading);
}

TEST(RolloutRules, ARollbackStopsTheRolloutAndSendsTheUpgradedNodesBack) {
  Rollout r = Advance(Fresh());
  r.Find("a")->state = NS::kPromoted;
  r = Advance(r);
  r.Find("b")->state = NS::kRolledBack;
  r.Find("b")->reason = "error rate 1.00 over the primary's 0.00";
  r = Advance(r);
  EXPECT_EQ(r.state, RolloutState::kRollingBack);
  EXPECT_NE(r.reason.find("node b rolled_back: error rate"), std::string::npos) << r.reason;
  EXPECT_EQ(StateOf(r, "a"), NS::kRollingBack);
  EXPECT_EQ(StateOf(r, "c"), NS::kPending) << "c never upgrades";
  EXPECT_FALSE(RolloutSettled(r));
  r.Find("a")->state = NS::kRolledBack;
  r = Advance(r);
  EXPECT_EQ(r.state, RolloutState::kRolledBack);
  EXPECT_TRUE(RolloutSettled(r));
  EXPECT_EQ(StateOf(r, "c"), NS::kPending);
}

TEST(RolloutRules, KeepUpgradedStopsWithoutSendingAnyoneBack) {
  Rollout r = Fresh(2, 4);
  r.keep_upgraded = true;
  r = Advance(r);
  r.Find("a")->state = NS::kFailed;
  r = Advance(r);
  EXPECT_EQ(r.state, RolloutState::kFailed);
  EXPECT_EQ(StateOf(r, "b"), NS::kUpgrading) << "the node in flight finishes";
  EXPECT_FALSE(RolloutSettled(r));
  r.Find("b")->state = NS::kPromoted;
  EXPECT_FALSE(AdvanceRollout(r, kAll, 200).has_value());
  EXPECT_TRUE(RolloutSettled(r));
  EXPECT_EQ(StateOf(r, "c"), NS::kPending);
}

TEST(RolloutRules, PausedStartsNothingButStillStopsOnARollback) {
  Rollout r = Advance(Fresh());
  r.state = RolloutState::kPaused;
  r.Find("a")->state = NS::kPromoted;
  EXPECT_FALSE(AdvanceRollout(r, kAll, 200).has_value());
  r.state = RolloutState::kRunning;
  r = Advance(r);
  EXPECT_EQ(StateOf(r, "b"), NS::kUpgrading);
  r.state = RolloutState::kPaused;
  r.Find("b")->state = NS::kRolledBack;
  r = Advance(r);
  EXPECT_EQ(r.state, RolloutState::kRollingBack);
  EXPECT_EQ(StateOf(r, "a"), NS::kRollingBack);
}

TEST(RolloutRules, ANodeMissingFromTheFleetFailsWhenItsTurnComes) {
  Rollout r = Advance(Fresh(), {"b", "c"});
  EXPECT_EQ(StateOf(r, "a"), NS::kFailed);
  EXPECT_EQ(r.Find("a")->reason, "not in the fleet when its turn came");
  r = Advance(r, {"b", "c"});
  EXPECT_EQ(r.state, RolloutState::kRolledBack) << "nobody was upgraded: nothing to roll back";
}

TEST(RolloutRules, AbortedRolloutsStartNothing) {
  Rollout r = Fresh();
  r.state = RolloutState::kAborted;
  EXPECT_FALSE(AdvanceRollout(r, kAll, 100).has_value());
  EXPECT_TRUE(RolloutSettled(r));
  r.nodes[0].state = NS::kRollingBack;
  EXPECT_FALSE(RolloutSettled(r)) << "its canary still rolls back";
}

TEST(RolloutNode, UpgradingStartsTheCanaryOnceAndReadsItsEnd) {
  Rollout r = Advance(Fresh());
  NodeDecision d = DecideNode(r, "a", Idle(kOld), 200);
  ASSERT_EQ(d.step, Step::kStartUpgrade);
  EXPECT_TRUE(d.entry.started);
  EXPECT_EQ(DecideNode(r, "b", Idle(kOld), 200).step, Step::kNone) << "not b's turn";
  EXPECT_EQ(DecideNode(r, "z", Idle(kOld), 200).step, Step::kNone) << "not in the rollout";
  // The canary runs; the write of `started` was lost to a conflict: written again, not started.
  d = DecideNode(r, "a", Canary(), 300);
  EXPECT_EQ(d.step, Step::kRecord);
  EXPECT_TRUE(d.entry.started);
  *r.Find("a") = d.entry;
  EXPECT_EQ(DecideNode(r, "a", Canary(), 400).step, Step::kNone);
  // Promoted: standbys launch with the new command.
  LocalUpgrade promoted = Idle(kNew);
  promoted.last_outcome = UpgradeOutcome::kPromoted;
  promoted.last_version = "engine-2";
  d = DecideNode(r, "a", promoted, 500);
  EXPECT_EQ(d.step, Step::kRecord);
  EXPECT_EQ(d.entry.state, NS::kPromoted);
  EXPECT_EQ(d.entry.version, "engine-2");
  // Or rolled back by its judge.
  LocalUpgrade rolled = Idle(kOld);
  rolled.last_outcome = UpgradeOutcome::kRolledBack;
  rolled.last_reason = "error rate 1.00";
  d = DecideNode(r, "a", rolled, 500);
  EXPECT_EQ(d.entry.state, NS::kRolledBack);
  EXPECT_EQ(d.entry.reason, "error rate 1.00");
}

TEST(RolloutNode, ARestartedControllerDecidesNothingUntilItHasReadoptedItsEngines) {
  Rollout r = Advance(Fresh());
  r.Find("a")->started = true;
  LocalUpgrade recovering = Idle(kOld);
  recovering.recovering = true;
  EXPECT_EQ(DecideNode(r, "a", recovering, 200).step, Step::kNone)
      << "its canary is not resumed yet: it has not ended";
  EXPECT_EQ(DecideNode(r, "a", Idle(kOld), 200).entry.state, NS::kRolledBack);
}

TEST(RolloutNode, ANodeThatAlreadyRunsTheCommandIsPromotedAtOnce) {
  const Rollout r = Advance(Fresh());
  const NodeDecision d = DecideNode(r, "a", Idle(kNew), 200);
  EXPECT_EQ(d.step, Step::kRecord);
  EXPECT_EQ(d.entry.state, NS::kPromoted);
}

TEST(RolloutNode, AnotherUpgradeInFlightFailsTheNode) {
  const Rollout r = Advance(Fresh());
  LocalUpgrade other = Canary();
  other.command = {"something", "else"};
  const NodeDecision d = DecideNode(r, "a", other, 200);
  EXPECT_EQ(d.entry.state, NS::kFailed);
}

TEST(RolloutNode, RollingBackRollsTheCanaryBackOrUpgradesBack) {
  Rollout r = Fresh();
  r.state = RolloutState::kRollingBack;
  r.nodes[0].state = NS::kRollingBack;
  // A canary in flight: rolled back, unless it already rolls back or takes over.
  NodeDecision d = DecideNode(r, "a", Canary(), 200);
  EXPECT_EQ(d.step, Step::kRollBackCanary);
  EXPECT_EQ(DecideNode(r, "a", Canary(Upgrade::Phase::kRollingBack), 200).step, Step::kNone);
  EXPECT_EQ(DecideNode(r, "a", Canary(Upgrade::Phase::kFinishing), 200).step, Step::kNone);
  // Promoted already: it upgrades back to the previous command.
  d = DecideNode(r, "a", Idle(kNew), 200);
  ASSERT_EQ(d.step, Step::kStartRollback);
  *r.Find("a") = d.entry;
  LocalUpgrade back{.in_flight = true,
                    .kind = UpgradeKind::kRollback,
                    .phase = Upgrade::Phase::kCanary,
                    .command = kOld,
                    .active = kNew};
  EXPECT_EQ(DecideNode(r, "a", back, 300).step, Step::kNone);
  d = DecideNode(r, "a", Idle(kOld), 400);
  EXPECT_EQ(d.step, Step::kRecord);
  EXPECT_EQ(d.entry.state, NS::kRolledBack);
  // A way back that was itself rolled back leaves the node on the new command: failed.
  LocalUpgrade stuck = Idle(kNew);
  stuck.last_reason = "outputs differ";
  d = DecideNode(r, "a", stuck, 400);
  EXPECT_EQ(d.entry.state, NS::kFailed);
  EXPECT_NE(d.entry.reason.find("outputs differ"), std::string::npos);
}

TEST(RolloutNode, RefusalsFailTheNodeUnlessTheyPass) {
  NodeDecision d{.step = Step::kStartUpgrade, .entry = {.node = "a", .state = NS::kUpgrading}};
  EXPECT_FALSE(AfterRefusedStep(d, Unavailable("the pair is degraded"), 1).has_value());
  std::optional<NodeRollout> e = AfterRefusedStep(d, FailedPrecondition("no standby"), 1);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->state, NS::kFailed);
  EXPECT_NE(e->reason.find("no standby"), std::string::npos);
  d.step = Step::kRollBackCanary;
  EXPECT_FALSE(AfterRefusedStep(d, FailedPrecondition("already taking over"), 1).has_value());
}

TEST(RolloutRecord, RoundTripsAndRefusesWhatIsWrong) {
  Rollout r = Advance(Fresh());
  r.steps = {50, 100};
  r.step_ms = 300;
  r.min_requests = 5;
  r.fraction = 0.5;
  r.keep_upgraded = true;
  r.reason = "why \xff";
  Result<Rollout> back = ParseRolloutRecord(RolloutRecord(r));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  r.reason = back->reason;  // invalid UTF-8 is replaced on the way out
  EXPECT_EQ(*back, r);
  EXPECT_FALSE(ParseRolloutRecord("[]").ok());
  EXPECT_FALSE(ParseRolloutRecord("{").ok());
  nlohmann::json j = RolloutJson(r);
  j["state"] = "sideways";
  EXPECT_FALSE(ParseRolloutRecord(j.dump()).ok());
  j = RolloutJson(r);
  j["nodes"].push_back(j["nodes"][0]);
  EXPECT_NE(ParseRolloutRecord(j.dump()).status().message().find("listed twice"),
            std::string::npos);
  j = RolloutJson(r);
  j.erase("command");
  EXPECT_NE(ParseRolloutRecord(j.dump()).status().message().find("'command'"), std::string::npos);
  j = RolloutJson(r);
  j["batch"] = 0;
  EXPECT_FALSE(ParseRolloutRecord(j.dump()).ok());
  // Numbers past their field's range are refused, not wrapped.
  j = RolloutJson(r);
  j["batch"] = 4294967297;  // 1 as a uint32_t
  EXPECT_NE(ParseRolloutRecord(j.dump()).status().message().find("'batch'"), std::string::npos);
  j = RolloutJson(r);
  j["steps"] = {50, 4294967396};  // 100 as a uint32_t
  EXPECT_NE(ParseRolloutRecord(j.dump()).status().message().find("'steps'"), std::string::npos);
  j = RolloutJson(r);
  j["steps"] = {50, 101};  // a percentage
  EXPECT_NE(ParseRolloutRecord(j.dump()).status().message().find("'steps'"), std::string::npos);
}

}  // namespace
}  // namespace baton
