// Scenarios of an engine's own progress reports (proto::Progress): a primary whose compute
// stands still while requests wait is killed as hung and replaced, with no health probe (its
// heartbeat thread would answer one); an idle primary, one whose steps move, one that reports
// nothing and a standby are left alone.
#include "tests/controller/core/scenario.h"

namespace baton::sim {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

class ProgressScenario : public Scenario {
 protected:
  static constexpr Duration kStallTimeout = seconds(1);

  ProgressScenario() { loop_.config().compute_stall_timeout = kStallTimeout; }

  // Time passes with `id` reporting (steps, pending) every 50 ms; `steps` grows by
  // `step_every` per report.
  void Report(EngineId id, Duration d, uint64_t steps, uint32_t pending, uint64_t step_every = 0) {
    const TimePoint end = loop_.clock().Now() + d;
    while (loop_.clock().Now() < end) {
      auto it = loop_.world().engines().find(id);
      if (it != loop_.world().engines().end() && it->second.Working() && it->second.attached) {
        SimEngine& e = it->second;
        loop_.world().Send(
            e, proto::Progress{.epoch = e.epoch, .steps_done = steps, .work_pending = pending},
            milliseconds(1));
      }
      steps += step_every;
      Wait(milliseconds(50));
    }
  }
  uint64_t ComputeStalls() { return coord().Snapshot().compute_stalls; }
};

TEST_F(ProgressScenario, APrimaryWhoseStepsStandStillWithWorkPendingIsKilledAsHung) {
  StartReadyPair();
  Report(primary_, kStallTimeout - milliseconds(100), 40, 2);
  ExpectNoEffect(E("Kill", primary_));
  Report(primary_, milliseconds(200), 40, 2);
  ExpectEffects({E("Kill", primary_), EpochDurable(2), "SaveRoster", Send(standby_, "Promote"),
                 "PublishRoutes"});
  WaitUntil([this] { return Ready() && coord().primary() == standby_; }, seconds(3),
            "the standby to serve");
  ExpectNoEffect(Send(primary_, "HealthRequest"));
  const CoordinatorStatus status = coord().Snapshot();
  ASSERT_FALSE(status.timelines.empty());
  EXPECT_EQ(status.timelines.back().cause.rfind("hung: compute stalled: no step finished for", 0),
            0u)
      << status.timelines.back().cause;
  EXPECT_EQ(ComputeStalls(), 1u);
}

TEST_F(ProgressScenario, AnIdlePrimaryIsNotFenced) {
  StartReadyPair();
  Report(primary_, 3 * kStallTimeout, 40, 0);
  ExpectNoEffect(E("Kill", primary_));
  EXPECT_EQ(coord().primary(), primary_);
  EXPECT_EQ(ComputeStalls(), 0u);
}

TEST_F(ProgressScenario, APrimaryWhoseStepsMoveIsNotFenced) {
  StartReadyPair();
  Report(primary_, 3 * kStallTimeout, 40, 5, /*step_every=*/1);
  ExpectNoEffect(E("Kill", primary_));
  EXPECT_EQ(ComputeStalls(), 0u);
}

TEST_F(ProgressScenario, AnEngineThatReportsNothingIsNotJudged) {
  StartReadyPair();
  Wait(3 * kStallTimeout);
  ExpectNoEffect(E("Kill", primary_));
  EXPECT_EQ(coord().engine(primary_)->progress, std::nullopt);
}

// A standby serves nothing: whatever it reports, it is not fenced for it.
TEST_F(ProgressScenario, AStandbyIsNotFenced) {
  StartReadyPair();
  Report(standby_, 3 * kStallTimeout, 0, 1);
  ExpectNoEffect(E("Kill", standby_));
  EXPECT_EQ(ComputeStalls(), 0u);
  // Its stall is past due but not judged: no wake-up at once, again and again.
  EXPECT_GT(coord().NextWakeup(), loop_.clock().Now());
}

// Reports that stop while the heartbeats go on give no verdict: the step count last seen is no
// proof that the compute still stands.
TEST_F(ProgressScenario, ReportsThatStopGiveNoVerdict) {
  StartReadyPair();
  Report(primary_, kStallTimeout / 2, 40, 2);
  Wait(3 * kStallTimeout);
  ExpectNoEffect(E("Kill", primary_));
}

TEST_F(ProgressScenario, ZeroTimeoutTurnsTheCheckOff) {
  loop_.config().compute_stall_timeout = Duration::zero();
  StartReadyPair();
  Report(primary_, 3 * kStallTimeout, 40, 2);
  ExpectNoEffect(E("Kill", primary_));
}

}  // namespace
}  // namespace baton::sim
