// Scenarios of `batonctl upgrade` (scenario.h): a canary that the router's outcomes promote,
// and one they roll back, each told as the effects the Coordinator takes, in order. The
// modelled router (tests/controller/sim_services.h) fails half the requests of a "--bad"
// version; the canary walks steps of 50 and 100 % of 150 ms each (SimConfig).
#include "tests/controller/core/scenario.h"

namespace baton::sim {
namespace {

using std::chrono::seconds;

class UpgradeScenario : public Scenario {
 protected:
  void Upgrade(std::vector<std::string> command) {
    ASSERT_TRUE(coord().RequestUpgrade(UpgradeRequest{.command = std::move(command)}).ok());
  }
  bool Upgrading() { return coord().Snapshot().upgrade.has_value(); }
  // Upgrades to `command` and returns the canary once it serves its first step.
  EngineId CanaryServing(std::vector<std::string> command) {
    Upgrade(std::move(command));
    WaitUntil(
        [this] {
          const CoordinatorStatus s = coord().Snapshot();
          return s.upgrade.has_value() && s.upgrade->phase == Upgrade::Phase::kCanary;
        },
        seconds(5), "the canary to serve");
    return coord().Snapshot().upgrade->canary;
  }
};

// The standby makes way for the canary (the command record written first); the primary
// returns blocks for the canary's first step; the canary is promoted at its own durable epoch
// and routed a share; at the last step the old primary drains and is retired, the canary
// serves alone and a standby of the new command is launched.
TEST_F(UpgradeScenario, CanaryThatServesWellIsPromoted) {
  StartReadyPair();
  Upgrade({"sim-engine", "--version=2"});
  WaitUntil([this] { return !Upgrading() && Ready(); }, seconds(5), "the upgrade to end");
  const EngineId canary = 3;
  ExpectEffects({"SaveCommandRecord", E("Kill", standby_), Launch(canary, "standby"),
                 Send(canary, "RegisterAck"), Send(primary_, "Reclaim"), EpochDurable(2),
                 Send(canary, "Promote"), "PublishRoutes", Send(canary, "Grant"),
                 Send(primary_, "Drain"), E("Kill", primary_), EpochDurable(3), "SaveCommandRecord",
                 "PublishRoutes", E("Release", primary_), Launch(4, "standby")});
  EXPECT_EQ(coord().primary(), canary);
  const CoordinatorStatus s = coord().Snapshot();
  EXPECT_EQ(s.upgrades_promoted, 1u);
  EXPECT_EQ(s.upgrades_rolled_back, 0u);
}

// After a promoted upgrade, a second upgrade's canary is rolled back (by `batonctl rollback`
// or by the judge): another `rollback` would undo the first upgrade, and is refused with the
// command that does it; nothing moves.
TEST_F(UpgradeScenario, ASecondRollbackAfterARolledBackCanaryIsRefused) {
  StartReadyPair();
  const std::vector<std::string> first = coord().Snapshot().active_command;
  Upgrade({"sim-engine", "--version=2"});
  WaitUntil([this] { return !Upgrading() && Ready(); }, seconds(5), "the first upgrade to end");
  Upgrade({"sim-engine", "--version=3", "--bad"});
  WaitUntil([this] { return !Upgrading() && Ready(); }, seconds(5), "the canary's rollback");
  ASSERT_EQ(coord().Snapshot().upgrades_rolled_back, 1u) << Story();
  const Status status = coord().RequestRollback();
  EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition) << status.ToString();
  EXPECT_NE(status.message().find("canary was rolled back already: engines run sim-engine "
                                  "--version=2; to go back further"),
            std::string::npos)
      << status.ToString();
  EXPECT_NE(status.message().find("batonctl upgrade -- " + baton::Joined(first)), std::string::npos)
      << status.ToString();
  EXPECT_FALSE(Upgrading());
  // An upgrade said in full still goes back.
  Upgrade(first);
  WaitUntil([this] { return !Upgrading() && Ready(); }, seconds(5), "the way back to end");
  EXPECT_EQ(coord().Snapshot().active_command, first) << Story();
}

// A canary that fails half its requests is judged against the primary and rolled back: it
// drains and is fenced, the primary gets its blocks back, and a standby of the previous
// command is launched. The primary never stops serving.
TEST_F(UpgradeScenario, CanaryThatFailsRequestsIsRolledBack) {
  StartReadyPair();
  Upgrade({"sim-engine", "--version=2", "--bad"});
  WaitUntil([this] { return !Upgrading() && Ready(); }, seconds(5), "the upgrade to end");
  Wait(std::chrono::milliseconds(500));  // the canary's blocks, past its barrier, go back
  const EngineId canary = 3;
  ExpectEffects({"SaveCommandRecord", E("Kill", standby_), Launch(canary, "standby"),
                 Send(primary_, "Reclaim"), EpochDurable(2), Send(canary, "Promote"),
                 "PublishRoutes", Send(canary, "Drain"), "PublishRoutes", E("Kill", canary),
                 "SaveCommandRecord", Launch(4, "standby"), E("BarrierPassed", canary),
                 Send(primary_, "Grant")});
  ExpectNoEffect(Send(primary_, "Drain"));
  ExpectNoEffect(E("Kill", primary_));
  EXPECT_EQ(coord().primary(), primary_);
  const CoordinatorStatus s = coord().Snapshot();
  EXPECT_EQ(s.upgrades_promoted, 0u);
  EXPECT_EQ(s.upgrades_rolled_back, 1u);
}

// An upgrade to a program that is not there is refused before anything moves: the standby
// stays, nothing is launched or recorded, and a later upgrade still works.
TEST_F(UpgradeScenario, AnUpgradeToAProgramThatIsNotThereIsRefusedAndTheStandbyStays) {
  StartReadyPair();
  const Status refused =
      coord().RequestUpgrade(UpgradeRequest{.command = {"missing-engine", "--version=2"}});
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition) << refused.ToString();
  EXPECT_NE(refused.message().find("missing-engine"), std::string::npos) << refused.ToString();
  Wait(std::chrono::milliseconds(200));
  ExpectNoEffect("SaveCommandRecord");
  ExpectNoEffect(E("Kill", standby_));
  EXPECT_FALSE(Upgrading());
  EXPECT_TRUE(Ready());
  Upgrade({"sim-engine", "--version=2"});
  // While the canary runs, the reserve is lent to it, and the status says so.
  WaitUntil([this] { return coord().Snapshot().reserve_target == 0; }, seconds(5),
            "the reserve lent to the canary");
  EXPECT_NE(coord().Snapshot().reserve_note.find("lent to an upgrade"), std::string::npos)
      << coord().Snapshot().reserve_note;
  WaitUntil([this] { return !Upgrading() && Ready(); }, seconds(5), "the upgrade to end");
  EXPECT_EQ(coord().Snapshot().upgrades_promoted, 1u);
  EXPECT_EQ(coord().Snapshot().reserve_note, "") << "the reserve is back";
}

// A canary that dies is the upgrade's failure, not the pair's: six in a row (each upgrade
// rolled back) count nothing against the crash-loop guard, and the standby of the active
// command is launched at once after each.
TEST_F(UpgradeScenario, CanariesThatDieDoNotTripTheCrashLoopGuard) {
  StartReadyPair();
  for (int i = 0; i < 6; ++i) {
    Upgrade({"sim-engine", "--version=2"});
    EngineId canary = kNoEngine;
    WaitUntil(
        [this, &canary] {
          const CoordinatorStatus s = coord().Snapshot();
          if (s.upgrade.has_value()) canary = s.upgrade->canary;
          return canary != kNoEngine && loop_.world().Find(canary) != nullptr;
        },
        seconds(5), "the canary's launch");
    loop_.world().Crash(canary);
    WaitUntil([this] { return !Upgrading() && Ready(); }, seconds(5), "the rollback");
  }
  const CoordinatorStatus s = coord().Snapshot();
  EXPECT_EQ(s.upgrades_rolled_back, 6u);
  EXPECT_EQ(s.guard_total_failures, 0u) << Story();
  EXPECT_FALSE(s.guard_in_backoff);
}

// The canary passed every step and the old primary drained, its Drained lost with the
// controller (kill -9): the next controller fences the drained primary and the canary takes
// over, as it would have; the upgrade is promoted, not rolled back.
TEST_F(UpgradeScenario, ACanaryWhoseOldPrimaryDrainedAcrossARestartTakesOver) {
  StartReadyPair();
  Upgrade({"sim-engine", "--version=2"});
  WaitUntil(
      [this] {
        const CoordinatorStatus s = coord().Snapshot();
        return s.upgrade.has_value() && s.upgrade->phase == Upgrade::Phase::kFinishing;
      },
      seconds(5), "the canary to pass every step");
  SimEngine& old = *loop_.world().Find(primary_);
  old.drained_at.reset();
  old.drained = true;  // drained while no controller ran: its Drained never arrived
  ControllerRestarts();
  WaitUntil([this] { return !Upgrading() && Ready(); }, seconds(5), "the upgrade to end");
  const EngineId canary = 3;
  EXPECT_EQ(coord().primary(), canary) << Story();
  const CoordinatorStatus s = coord().Snapshot();
  EXPECT_EQ(s.upgrades_promoted, 1u) << Story();
  EXPECT_EQ(s.upgrades_rolled_back, 0u) << Story();
  ExpectNoEffect(E("Kill", canary));
}

// The hand-over's timeline says the epoch the canary serves at (its own, from its promotion as
// the canary), not the old primary's fence epoch, and has no `injected` stamp: nothing was
// injected, the old primary was asked to drain (`requested`).
TEST_F(UpgradeScenario, TheHandOverTimelineSaysTheEpochTheCanaryServesAt) {
  StartReadyPair();
  Upgrade({"sim-engine", "--version=2"});
  WaitUntil([this] { return !Upgrading() && Ready(); }, seconds(5), "the upgrade to end");
  const EngineId canary = 3;
  ASSERT_EQ(coord().primary(), canary) << Story();
  const uint64_t serving_epoch = coord().ledger().engine(canary)->epoch;
  EXPECT_EQ(serving_epoch, 2u);
  const CoordinatorStatus s = coord().Snapshot();
  ASSERT_FALSE(s.timelines.empty());
  const PromotionRecord& r = s.timelines.back();
  EXPECT_EQ(r.kind, PromotionKind::kUpgrade);
  EXPECT_EQ(r.new_engine, canary);
  EXPECT_EQ(r.epoch, serving_epoch);
  EXPECT_EQ(r.fence_epoch, 3u) << "the old primary is fenced at the next epoch";
  EXPECT_FALSE(r.injected.has_value());
  EXPECT_TRUE(r.requested.has_value());
  const std::string text = TimelineText(r, s.now);
  EXPECT_NE(text.find("-> engine 3 at epoch 2 (engine 1 fenced at epoch 3)"), std::string::npos)
      << text;
  EXPECT_EQ(text.find("injected"), std::string::npos) << text;
  EXPECT_EQ(TimelineJson(r, s.now)["epoch"], serving_epoch);
}

// The primary dies while the canary serves: the canary takes over at its own epoch, and the
// failover's timeline says that one.
TEST_F(UpgradeScenario, AFailoverToTheCanarySaysTheEpochTheCanaryServesAt) {
  StartReadyPair();
  Upgrade({"sim-engine", "--version=2"});
  WaitUntil(
      [this] {
        const CoordinatorStatus s = coord().Snapshot();
        return s.upgrade.has_value() && s.upgrade->phase == Upgrade::Phase::kCanary;
      },
      seconds(5), "the canary to serve");
  PrimaryDies();
  WaitUntil([this] { return !Upgrading() && coord().primary() == 3; }, seconds(5),
            "the canary to take over");
  const CoordinatorStatus s = coord().Snapshot();
  ASSERT_FALSE(s.timelines.empty());
  const PromotionRecord& r = s.timelines.back();
  EXPECT_EQ(r.kind, PromotionKind::kFailover);
  EXPECT_EQ(r.new_engine, 3u);
  EXPECT_EQ(r.epoch, coord().ledger().engine(3)->epoch) << TimelineText(r, s.now);
  EXPECT_GT(r.fence_epoch, r.epoch);
}

// A controller restart while the canary is still a standby (its blocks being reclaimed, not
// promoted): the canary is re-adopted as a standby, and the upgrade is rolled back, saying so
// (not that the canary did not come back).
TEST_F(UpgradeScenario, ARestartBeforeTheCanaryIsPromotedRollsItBackAndSaysWhy) {
  StartReadyPair();
  Upgrade({"sim-engine", "--version=2"});
  const TimePoint end = loop_.clock().Now() + seconds(5);
  auto reclaiming = [this] {
    const CoordinatorStatus s = coord().Snapshot();
    return s.upgrade.has_value() && s.upgrade->phase == Upgrade::Phase::kReclaiming;
  };
  while (!reclaiming() && loop_.clock().Now() < end) loop_.RunFor(std::chrono::microseconds(100));
  ASSERT_TRUE(reclaiming()) << Story();
  ControllerRestarts();
  WaitUntil([this] { return !Upgrading() && Ready(); }, seconds(5), "the rollback");
  const CoordinatorStatus s = coord().Snapshot();
  ASSERT_TRUE(s.recovery.upgrade.has_value()) << Story();
  EXPECT_NE(s.recovery.upgrade->find("rolled back: its canary came back as a standby"),
            std::string::npos)
      << *s.recovery.upgrade;
  ASSERT_FALSE(s.upgrade_history.empty());
  EXPECT_EQ(s.upgrade_history.back().outcome, UpgradeOutcome::kRolledBack);
  EXPECT_NE(s.upgrade_history.back().reason.find("not promoted yet"), std::string::npos)
      << s.upgrade_history.back().reason;
  EXPECT_EQ(coord().primary(), primary_);
}

// A primary that ignores the canary's Reclaim is asked again kReclaimAnswerTimeout after it
// was asked, with one WARN line that says so, while the canary serves on what was free.
TEST_F(UpgradeScenario, AnIgnoredCanaryReclaimIsAskedAgainWithOneWarning) {
  StartReadyPair();
  loop_.world().Find(primary_)->holds_reclaims = true;
  ::testing::internal::CaptureStderr();
  ASSERT_TRUE(coord()
                  .RequestUpgrade(UpgradeRequest{.command = {"sim-engine", "--version=2"},
                                                 .steps = std::vector<uint32_t>{50, 100},
                                                 .step_duration = seconds(60)})
                  .ok());
  WaitUntil([this] { return !loop_.world().Find(primary_)->held_reclaims.empty(); }, seconds(5),
            "the canary's Reclaim");
  Wait(CoordinatorState::kReclaimAnswerTimeout + seconds(3));
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(loop_.world().Find(primary_)->held_reclaims.size(), 2u) << Story();
  const std::string warn = "WARN upgrade: engine " + std::to_string(primary_) +
                           " (the primary) did not answer its Reclaim of ";
  EXPECT_EQ(Occurrences(log, warn), 1u) << log;
  EXPECT_NE(log.find(" blocks for the canary in "), std::string::npos) << log;
  EXPECT_TRUE(Upgrading()) << Story();
}

// The primary and the canary die together (kill -9 of both): the canary, dying too, does not
// take over; its death rolls the upgrade back, and the pair comes back on the command it ran.
TEST_F(UpgradeScenario, ACanaryThatDiesWithThePrimaryIsNotPromoted) {
  StartReadyPair();
  const std::vector<std::string> first = coord().Snapshot().active_command;
  const EngineId canary = CanaryServing({"sim-engine", "--version=2"});
  loop_.world().Crash(primary_);
  loop_.world().Crash(canary);
  WaitUntil([this] { return !Upgrading() && Ready(); }, seconds(5), "the pair to come back");
  const CoordinatorStatus s = coord().Snapshot();
  EXPECT_EQ(s.upgrades_promoted, 0u) << Story();
  EXPECT_EQ(s.upgrades_rolled_back, 1u);
  EXPECT_EQ(s.active_command, first);
  // Never promoted, not promoted and then undone.
  ASSERT_FALSE(s.upgrade_history.empty());
  EXPECT_EQ(s.upgrade_history.back().reason.find("then the canary failed too"), std::string::npos)
      << s.upgrade_history.back().reason;
  EXPECT_NE(coord().primary(), canary);
  for (const EngineStatus& e : s.engines) {
    if (e.id == coord().primary()) {
      EXPECT_EQ(e.command, first);
    }
  }
}

// The primary dies while the canary, hung already, still looks alive: the canary takes over,
// but fails before its first heartbeat since; the upgrade is rolled back then, and the pair
// comes back on the command it ran.
TEST_F(UpgradeScenario, ACanaryThatFailsBeforeItsFirstHeartbeatAfterTakingOverIsRolledBack) {
  StartReadyPair();
  const std::vector<std::string> first = coord().Snapshot().active_command;
  const EngineId canary = CanaryServing({"sim-engine", "--version=2"});
  loop_.world().Hang(canary);
  loop_.world().Crash(primary_);
  WaitUntil([this, canary] { return coord().primary() == canary; }, seconds(2), "the takeover");
  EXPECT_EQ(coord().Snapshot().upgrades_promoted, 1u);
  WaitUntil([this, canary] { return Ready() && coord().primary() != canary; }, seconds(5),
            "the hung canary to be replaced");
  const CoordinatorStatus s = coord().Snapshot();
  EXPECT_EQ(s.upgrades_promoted, 0u) << Story();
  EXPECT_EQ(s.upgrades_rolled_back, 1u);
  EXPECT_EQ(s.active_command, first);
  ASSERT_FALSE(s.upgrade_history.empty());
  EXPECT_EQ(s.upgrade_history.back().outcome, UpgradeOutcome::kRolledBack);
  EXPECT_NE(s.upgrade_history.back().reason.find("the canary failed too"), std::string::npos)
      << s.upgrade_history.back().reason;
}

}  // namespace
}  // namespace baton::sim
