// Scenarios of `batonctl drain` (scenario.h): the primary is told that no next primary follows
// (FinalDrain: it finishes its requests, a switch-over's Drain lets it hand them over), and a
// drained pair stays out of service through a controller restart until `batonctl resume`.
#include <functional>

#include "tests/controller/core/scenario.h"

namespace baton::sim {
namespace {

using std::chrono::seconds;

class DrainScenario : public Scenario {
 protected:
  bool Stopped() { return coord().pair_state() == PairState::kStopped && !coord().recovering(); }
  size_t Launches() {
    return static_cast<size_t>(std::count_if(journal_.begin(), journal_.end(), [](const auto& e) {
      return e.rfind("Launch(", 0) == 0;
    }));
  }
};

// A drain has no next primary: FinalDrain, never Drain; a switch-over has one: Drain.
TEST_F(DrainScenario, ADrainTellsThePrimaryThatNoNextPrimaryFollows) {
  StartReadyPair();
  ASSERT_TRUE(coord().RequestSwitchover().ok());
  WaitUntil([this] { return Ready() && coord().primary() == standby_; }, seconds(3),
            "the switch-over");
  ExpectEffects({Send(primary_, "Drain")});
  ExpectNoEffect(Send(primary_, "FinalDrain"));
  const EngineId primary = coord().primary();
  journal_.clear();
  ASSERT_TRUE(coord().RequestDrain().ok());
  WaitUntil([this] { return Stopped(); }, seconds(3), "the drained pair to stop");
  ExpectEffects({Send(primary, "FinalDrain")});
  ExpectNoEffect(Send(primary, "Drain"));
  EXPECT_EQ(coord().Snapshot().failovers, 0u) << "planned: neither is a failover";
}

// A drain's timeline ends when the pair stops: the resume's promotion is a timeline of its
// own, whose phases do not count the time the pair stood stopped.
TEST_F(DrainScenario, ADrainsTimelineEndsWhenThePairStops) {
  StartReadyPair();
  ASSERT_TRUE(coord().RequestDrain().ok());
  WaitUntil([this] { return Stopped(); }, seconds(3), "the drained pair to stop");
  std::deque<PromotionRecord> t = coord().Snapshot().timelines;
  ASSERT_FALSE(t.empty());
  EXPECT_EQ(t.back().kind, PromotionKind::kDrain);
  EXPECT_EQ(t.back().outcome, "stopped: the pair was drained (batonctl resume starts it again)");
  EXPECT_NE(TimelineText(t.back(), loop_.clock().Now()).find(" -> no engine at epoch "),
            std::string::npos)
      << TimelineText(t.back(), loop_.clock().Now());
  Wait(seconds(5));  // stopped for a while
  ASSERT_TRUE(coord().RequestResume().ok());
  WaitUntil([this] { return Ready(); }, seconds(5), "the pair to serve again");
  t = coord().Snapshot().timelines;
  ASSERT_GE(t.size(), 2u);
  EXPECT_EQ(t.back().kind, PromotionKind::kPromotion);
  const std::optional<double> ready = PhasesOf(t.back()).ready_ms;
  ASSERT_TRUE(ready.has_value());
  EXPECT_LT(*ready, 1000.0) << "the stopped time is not the resume's";
}

// An engine of protocol 8 knows no FinalDrain: it is sent Drain (and may hand its requests
// over to a next primary that never comes; the controller logs a warning).
TEST_F(DrainScenario, AnEngineOfProtocol8IsSentDrain) {
  loop_.set_engine_protocol(8);
  StartReadyPair();
  ASSERT_TRUE(coord().RequestDrain().ok());
  WaitUntil([this] { return Stopped(); }, seconds(3), "the drained pair to stop");
  ExpectEffects({Send(primary_, "Drain")});
  ExpectNoEffect(Send(primary_, "FinalDrain"));
}

// Stopped, then the controller is killed: the next one starts no engine, and the pair stays
// stopped until resumed.
TEST_F(DrainScenario, AStoppedPairStaysStoppedThroughARestart) {
  StartReadyPair();
  ASSERT_TRUE(coord().RequestDrain().ok());
  WaitUntil([this] { return Stopped(); }, seconds(3), "the drained pair to stop");
  journal_.clear();
  ControllerRestarts();
  Wait(seconds(5));
  EXPECT_TRUE(Stopped()) << ToString(coord().pair_state()) << "\n" << Story();
  EXPECT_EQ(Launches(), 0u) << Story();
  ASSERT_TRUE(coord().RequestResume().ok());
  WaitUntil([this] { return Ready(); }, seconds(5), "the resumed pair");
}

// The controller is killed while the primary drains: the primary reattaches draining, the
// drain goes on to its end, and nothing is launched.
TEST_F(DrainScenario, ADrainARestartInterruptsGoesOn) {
  StartReadyPair();
  ASSERT_TRUE(coord().RequestDrain().ok());
  journal_.clear();
  ControllerRestarts();
  WaitUntil([this] { return Stopped(); }, seconds(5), "the drain to end");
  Wait(seconds(3));
  EXPECT_TRUE(Stopped()) << ToString(coord().pair_state()) << "\n" << Story();
  EXPECT_EQ(Launches(), 0u) << Story();
}

// The primary drains slowly (its requests are long); the standby, fenced by the drain, is
// gone. Then `how` befalls the primary, the controller restarts, and the next controller must
// launch nothing: the drain ends with the primary, no failover.
class DrainThroughRestartScenario : public DrainScenario {
 protected:
  void SlowDrainThenRestart(const std::function<void()>& how) {
    StartReadyPair();
    ASSERT_TRUE(coord().RequestDrain().ok());
    loop_.world().Find(primary_)->drained_at = loop_.clock().Now() + seconds(60);
    Wait(std::chrono::milliseconds(200));  // the standby reaped
    ASSERT_EQ(coord().engine(standby_), nullptr) << Story();
    how();
    journal_.clear();
    ControllerRestarts();
    Wait(seconds(5));
    EXPECT_TRUE(Stopped()) << ToString(coord().pair_state()) << "\n" << Story();
    EXPECT_EQ(Launches(), 0u) << Story();
    ExpectNoEffect(Send(primary_, "Resume"));
  }
};

TEST_F(DrainThroughRestartScenario, APrimaryThatDiedWhileDrainingEndsTheDrain) {
  SlowDrainThenRestart([this] { PrimaryDies(); });
}

TEST_F(DrainThroughRestartScenario, APrimaryThatNeverReattachesEndsTheDrain) {
  SlowDrainThenRestart([this] { PrimaryHangs(); });
}

// A second restart while the first recovery still waits: the roster the first recovery saved
// keeps the drain, so the primary is not resumed and nothing is launched.
TEST_F(DrainThroughRestartScenario, ADrainSurvivesARestartDuringTheRecovery) {
  SlowDrainThenRestart([this] { ControllerRestarts(); });
}

// The draining primary dies with the controller: the next controller launches nothing, the
// pair is stopped.
TEST_F(DrainScenario, ADrainingPrimaryThatDiesWithTheControllerLeavesThePairStopped) {
  StartReadyPair();
  ASSERT_TRUE(coord().RequestDrain().ok());
  PrimaryDies();
  journal_.clear();
  ControllerRestarts();
  Wait(seconds(5));
  EXPECT_TRUE(Stopped()) << ToString(coord().pair_state()) << "\n" << Story();
  EXPECT_EQ(Launches(), 0u) << Story();
}

// A controller that stops stops its engines: its last route table lists none, so that the
// routers stop sending them requests (and their /health says so) before they are gone.
TEST_F(DrainScenario, AStopPublishesATableWithNoEngine) {
  StartReadyPair();
  ASSERT_TRUE(loop_.effects().routes().has_value());
  EXPECT_FALSE(loop_.effects().routes()->entries.empty());
  journal_.clear();
  coord().BeginShutdown();
  ExpectEffects({"PublishRoutes"});
  ASSERT_TRUE(loop_.effects().routes().has_value());
  EXPECT_TRUE(loop_.effects().routes()->entries.empty());
  EXPECT_EQ(loop_.effects().routes()->pair_state, "stopping");
}

}  // namespace
}  // namespace baton::sim
