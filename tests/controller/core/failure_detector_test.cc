#include "controller/core/failure_detector.h"

#include <gtest/gtest.h>

namespace baton {
namespace {

using std::chrono::milliseconds;
using Action = FailureDetector::Action;
using State = FailureDetector::State;

TEST(FailureDetectorTest, DefaultsAreHundredMillisTimesThree) {
  FakeClock clock;
  FailureDetector detector(clock);
  EXPECT_EQ(detector.suspect_after(), milliseconds(300));
  EXPECT_EQ(detector.NextDeadline(), clock.Now() + milliseconds(300));
}

TEST(FailureDetectorTest, RegularHeartbeatsNeverSuspect) {
  FakeClock clock;
  FailureDetector detector(clock);
  for (int i = 0; i < 100; ++i) {
    clock.Advance(milliseconds(100));
    detector.OnHeartbeat();
    EXPECT_EQ(detector.Poll(), Action::kNone);
  }
  EXPECT_EQ(detector.state(), State::kHealthy);
}

TEST(FailureDetectorTest, SlowButAliveEngineUnderLoadIsNotKilled) {
  FakeClock clock;
  FailureDetector detector(clock);
  // Heartbeats late (290 ms apart), and once silent long enough to be probed: the health
  // reply clears it.
  for (int i = 0; i < 20; ++i) {
    clock.Advance(milliseconds(290));
    EXPECT_EQ(detector.Poll(), Action::kNone);
    detector.OnHeartbeat();
  }
  clock.Advance(milliseconds(350));
  EXPECT_EQ(detector.Poll(), Action::kSendProbe);
  clock.Advance(milliseconds(40));
  detector.OnHealthReply();
  EXPECT_EQ(detector.state(), State::kHealthy);
  clock.Advance(milliseconds(200));
  EXPECT_EQ(detector.Poll(), Action::kNone);
}

TEST(FailureDetectorTest, SilenceIsProbedOnceThenConfirmedOnce) {
  FakeClock clock;
  FailureDetector detector(clock);
  clock.Advance(milliseconds(299));
  EXPECT_EQ(detector.Poll(), Action::kNone);
  clock.Advance(milliseconds(1));
  EXPECT_EQ(detector.Poll(), Action::kSendProbe);
  EXPECT_EQ(detector.state(), State::kProbing);
  EXPECT_EQ(detector.Poll(), Action::kNone);  // the probe is not repeated
  EXPECT_EQ(detector.NextDeadline(), clock.Now() + milliseconds(100));
  clock.Advance(milliseconds(99));
  EXPECT_EQ(detector.Poll(), Action::kNone);
  clock.Advance(milliseconds(1));
  EXPECT_EQ(detector.Poll(), Action::kDeclareHung);
  EXPECT_EQ(detector.state(), State::kHung);
  EXPECT_EQ(detector.Poll(), Action::kNone);  // declared once
  EXPECT_EQ(detector.NextDeadline(), TimePoint::max());
}

TEST(FailureDetectorTest, LateHeartbeatAfterHungDoesNotRevive) {
  FakeClock clock;
  FailureDetector detector(clock);
  clock.Advance(milliseconds(300));
  ASSERT_EQ(detector.Poll(), Action::kSendProbe);
  clock.Advance(milliseconds(100));
  ASSERT_EQ(detector.Poll(), Action::kDeclareHung);
  detector.OnHeartbeat();
  EXPECT_EQ(detector.state(), State::kHung);
}

TEST(FailureDetectorTest, LongStallStillProbesBeforeDeclaring) {
  FakeClock clock;
  FailureDetector detector(clock);
  clock.Advance(std::chrono::seconds(10));  // the controller itself was delayed
  EXPECT_EQ(detector.Poll(), Action::kSendProbe);
  detector.OnHealthReply();
  EXPECT_EQ(detector.Poll(), Action::kNone);
  EXPECT_EQ(detector.state(), State::kHealthy);
}

// The verdict was due 100 ms after the probe; a Poll 350 ms after it means the controller's
// own loop stalled for 250 ms, long enough that the answer may sit unread: probe again.
TEST(FailureDetectorTest, LateVerdictProbesAgainAndTheAnswerKeepsTheEngine) {
  FakeClock clock;
  FailureDetector detector(clock);
  clock.Advance(milliseconds(300));
  ASSERT_EQ(detector.Poll(), Action::kSendProbe);
  clock.Advance(milliseconds(350));
  EXPECT_EQ(detector.Poll(), Action::kProbeAgain);
  EXPECT_EQ(detector.state(), State::kProbing);
  EXPECT_EQ(detector.late_probes(), 1);
  EXPECT_EQ(detector.NextDeadline(), clock.Now() + milliseconds(100));
  detector.OnHealthReply();
  EXPECT_EQ(detector.state(), State::kHealthy);
  EXPECT_EQ(detector.late_probes(), 0);
}

// A loop that stays late still gets a verdict: after kMaxLateProbes late ones, the next is
// given, late or not.
TEST(FailureDetectorTest, ALoopThatStaysLateStillDeclaresAHungEngine) {
  FakeClock clock;
  FailureDetector detector(clock);
  clock.Advance(milliseconds(300));
  ASSERT_EQ(detector.Poll(), Action::kSendProbe);
  for (int i = 0; i < FailureDetector::kMaxLateProbes; ++i) {
    clock.Advance(milliseconds(500));
    EXPECT_EQ(detector.Poll(), Action::kProbeAgain) << i;
  }
  clock.Advance(milliseconds(500));
  EXPECT_EQ(detector.Poll(), Action::kDeclareHung);
  EXPECT_EQ(detector.state(), State::kHung);
}

// A verdict less than one probe_timeout late is given: the loop ran, the answer had its turn.
TEST(FailureDetectorTest, AVerdictSlightlyLateIsGiven) {
  FakeClock clock;
  FailureDetector detector(clock);
  clock.Advance(milliseconds(300));
  ASSERT_EQ(detector.Poll(), Action::kSendProbe);
  clock.Advance(milliseconds(199));
  EXPECT_EQ(detector.Poll(), Action::kDeclareHung);
}

TEST(FailureDetectorTest, CustomOptionsAndBadValuesAreSanitized) {
  FakeClock clock;
  FailureDetector::Options options;
  options.heartbeat_interval = milliseconds(50);
  options.misses = 0;
  options.probe_timeout = Duration::zero();
  FailureDetector detector(clock, options);
  EXPECT_EQ(detector.suspect_after(), milliseconds(50));
  clock.Advance(milliseconds(50));
  EXPECT_EQ(detector.Poll(), Action::kSendProbe);
  clock.Advance(milliseconds(100));
  EXPECT_EQ(detector.Poll(), Action::kDeclareHung);
}

}  // namespace
}  // namespace baton
