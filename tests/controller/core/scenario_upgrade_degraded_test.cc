// Scenarios of `batonctl upgrade` and `batonctl rollback` on a pair that is not whole: a
// standby that crash-loops (the crash-loop guard holding its restarts back) is replaced by the
// canary at once; with no engine serving, the command is switched with no canary. This is the
// way out the alerts' runbook gives for a crash loop after an upgrade.
#include "tests/controller/core/scenario.h"

namespace baton::sim {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

class DegradedUpgradeScenario : public Scenario {
 protected:
  bool Upgrading() { return coord().Snapshot().upgrade.has_value(); }
  bool Backoff() {
    const PairState s = coord().pair_state();
    return s == PairState::kDegradedBackoff || s == PairState::kDownBackoff;
  }
  // An upgrade to "--version=2" that the canary passes in two quick steps.
  void PromoteVersion2() {
    ASSERT_TRUE(coord()
                    .RequestUpgrade(UpgradeRequest{.command = {"sim-engine", "--version=2"},
                                                   .steps = std::vector<uint32_t>{50, 100},
                                                   .step_duration = milliseconds(150)})
                    .ok());
    WaitUntil([this] { return !Upgrading() && Ready(); }, seconds(5), "the upgrade to end");
    ASSERT_EQ(coord().Snapshot().upgrades_promoted, 1u) << Story();
  }
  // The standby (and the primary too, if asked) dies as soon as it runs, until the guard holds
  // restarts back.
  void CrashLoop(bool primary_too) {
    WaitUntil(
        [&] {
          for (EngineId id : LiveEngines()) {
            if (primary_too || id != coord().primary()) loop_.world().Crash(id);
          }
          return Backoff();
        },
        seconds(10), "the crash-loop guard to trip");
  }
  std::vector<EngineId> LiveEngines() {
    std::vector<EngineId> ids;
    for (const auto& [id, e] : loop_.world().engines()) {
      const EngineRecord* r = coord().engine(id);
      if (r != nullptr && r->live() && e.alive) ids.push_back(id);
    }
    return ids;
  }
  std::vector<std::string> PrimaryCommand() {
    for (const EngineStatus& e : coord().Snapshot().engines) {
      if (e.id == coord().primary()) return e.command;
    }
    return {};
  }
};

// The standby crash-loops beside a serving primary: an upgrade is taken, its canary launched
// at once (the backoff lifted), judged and promoted; the primary served throughout.
TEST_F(DegradedUpgradeScenario, AnUpgradeReplacesACrashLoopingStandby) {
  StartReadyPair();
  CrashLoop(/*primary_too=*/false);
  ASSERT_EQ(coord().pair_state(), PairState::kDegradedBackoff);
  ASSERT_EQ(coord().primary(), primary_);
  ASSERT_TRUE(coord()
                  .RequestUpgrade(UpgradeRequest{.command = {"sim-engine", "--version=9"},
                                                 .steps = std::vector<uint32_t>{50, 100},
                                                 .step_duration = milliseconds(150)})
                  .ok())
      << Story();
  Wait(milliseconds(50));  // shorter than any backoff
  ASSERT_TRUE(Upgrading());
  EXPECT_NE(coord().Snapshot().upgrade->canary, kNoEngine) << "the canary waits out the backoff";
  WaitUntil([this] { return !Upgrading() && Ready(); }, seconds(5), "the upgrade to end");
  EXPECT_EQ(coord().Snapshot().upgrades_promoted, 1u) << Story();
  EXPECT_EQ(PrimaryCommand(), (std::vector<std::string>{"sim-engine", "--version=9"}));
}

// After a promoted upgrade, the new command's standby crash-loops: `batonctl rollback` starts
// a canary of the previous command in its place, which takes over.
TEST_F(DegradedUpgradeScenario, RollbackIsTheWayOutOfACrashLoopAfterAnUpgrade) {
  StartReadyPair();
  const std::vector<std::string> first = coord().Snapshot().active_command;
  PromoteVersion2();
  CrashLoop(/*primary_too=*/false);
  ASSERT_TRUE(coord().RequestRollback().ok()) << Story();
  ASSERT_TRUE(Upgrading());
  EXPECT_EQ(coord().Snapshot().upgrade->kind, UpgradeKind::kRollback);
  WaitUntil([this] { return !Upgrading() && Ready(); }, seconds(5), "the rollback to end");
  EXPECT_EQ(coord().Snapshot().active_command, first);
  EXPECT_EQ(PrimaryCommand(), first) << Story();
}

// With no engine serving there is no canary to judge: the rollback switches the command at
// once, recorded as such, and the next engines launch with it.
TEST_F(DegradedUpgradeScenario, WithNoEngineServingRollbackSwitchesTheCommandAtOnce) {
  StartReadyPair();
  const std::vector<std::string> first = coord().Snapshot().active_command;
  PromoteVersion2();
  CrashLoop(/*primary_too=*/true);
  ASSERT_EQ(coord().pair_state(), PairState::kDownBackoff) << Story();
  ASSERT_TRUE(coord().RequestRollback().ok()) << Story();
  EXPECT_FALSE(Upgrading());
  const CoordinatorStatus s = coord().Snapshot();
  EXPECT_EQ(s.active_command, first);
  ASSERT_FALSE(s.upgrade_history.empty());
  EXPECT_EQ(s.upgrade_history.back().kind, UpgradeKind::kRollback);
  EXPECT_EQ(s.upgrade_history.back().outcome, UpgradeOutcome::kPromoted);
  EXPECT_NE(s.upgrade_history.back().reason.find("no engine served"), std::string::npos)
      << s.upgrade_history.back().reason;
  WaitUntil([this] { return Ready(); }, seconds(5), "the pair to be ready again");
  EXPECT_EQ(PrimaryCommand(), first) << Story();
  for (const EngineStatus& e : coord().Snapshot().engines) {
    if (e.state == EngineState::kStandby) {
      EXPECT_EQ(e.command, first);
    }
  }
}

// A pair in the middle of a failover takes no upgrade: it says so and nothing moves.
TEST_F(DegradedUpgradeScenario, AFailoverInProgressRefusesAnUpgrade) {
  StartReadyPair();
  loop_.world().Hang(primary_);
  WaitUntil([this] { return coord().pair_state() == PairState::kFailingOver; }, seconds(5),
            "the failover");
  const Status status = coord().RequestUpgrade(UpgradeRequest{.command = {"sim-engine"}});
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("an upgrade needs a serving primary"), std::string::npos)
      << status.ToString();
  EXPECT_FALSE(Upgrading());
}

}  // namespace
}  // namespace baton::sim
