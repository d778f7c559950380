#include "controller/core/failure_detector.h"

#include <gtest/gtest.h>

namespace baton {
namespace {

using std::chrono::milliseconds;
using Action = FailureDetector::Action;
using State = FailureDetector::State;

// Default options: a heartbeat every 100 ms, suspected after 3 missed, a probe answered
// within 100 ms.
class FailureDetectorTest : public ::testing::Test {
 protected:
  // 300 ms of silence: the engine is probed.
  void SilentUntilProbed() {
    clock_.Advance(milliseconds(300));
    ASSERT_EQ(detector_.Poll(), Action::kSendProbe);
  }

  FakeClock clock_;
  FailureDetector detector_{clock_};
};

TEST_F(FailureDetectorTest, DefaultsAreHundredMillisTimesThree) {
  EXPECT_EQ(detector_.suspect_after(), milliseconds(300));
  EXPECT_EQ(detector_.NextDeadline(), clock_.Now() + milliseconds(300));
}

TEST_F(FailureDetectorTest, RegularHeartbeatsNeverSuspect) {
  for (int i = 0; i < 100; ++i) {
    clock_.Advance(milliseconds(100));
    detector_.OnHeartbeat();
    EXPECT_EQ(detector_.Poll(), Action::kNone);
  }
  EXPECT_EQ(detector_.state(), State::kHealthy);
}

TEST_F(FailureDetectorTest, SlowButAliveEngineUnderLoadIsNotKilled) {
  // Heartbeats late (290 ms apart), and once silent long enough to be probed: the health
  // reply clears it.
  for (int i = 0; i < 20; ++i) {
    clock_.Advance(milliseconds(290));
    EXPECT_EQ(detector_.Poll(), Action::kNone);
    detector_.OnHeartbeat();
  }
  clock_.Advance(milliseconds(350));
  EXPECT_EQ(detector_.Poll(), Action::kSendProbe);
  clock_.Advance(milliseconds(40));
  detector_.OnHealthReply();
  EXPECT_EQ(detector_.state(), State::kHealthy);
  clock_.Advance(milliseconds(200));
  EXPECT_EQ(detector_.Poll(), Action::kNone);
}

TEST_F(FailureDetectorTest, SilenceIsProbedOnceThenConfirmedOnce) {
  clock_.Advance(milliseconds(299));
  EXPECT_EQ(detector_.Poll(), Action::kNone);
  clock_.Advance(milliseconds(1));
  EXPECT_EQ(detector_.Poll(), Action::kSendProbe);
  EXPECT_EQ(detector_.state(), State::kProbing);
  EXPECT_EQ(detector_.Poll(), Action::kNone);  // the probe is not repeated
  EXPECT_EQ(detector_.NextDeadline(), clock_.Now() + milliseconds(100));
  clock_.Advance(milliseconds(99));
  EXPECT_EQ(detector_.Poll(), Action::kNone);
  clock_.Advance(milliseconds(1));
  EXPECT_EQ(detector_.Poll(), Action::kDeclareHung);
  EXPECT_EQ(detector_.state(), State::kHung);
  EXPECT_EQ(detector_.Poll(), Action::kNone);  // declared once
  EXPECT_EQ(detector_.NextDeadline(), TimePoint::max());
}

TEST_F(FailureDetectorTest, LateHeartbeatAfterHungDoesNotRevive) {
  ASSERT_NO_FATAL_FAILURE(SilentUntilProbed());
  clock_.Advance(milliseconds(100));
  ASSERT_EQ(detector_.Poll(), Action::kDeclareHung);
  detector_.OnHeartbeat();
  EXPECT_EQ(detector_.state(), State::kHung);
}

TEST_F(FailureDetectorTest, LongStallStillProbesBeforeDeclaring) {
  clock_.Advance(std::chrono::seconds(10));  // the controller itself was delayed
  EXPECT_EQ(detector_.Poll(), Action::kSendProbe);
  detector_.OnHealthReply();
  EXPECT_EQ(detector_.Poll(), Action::kNone);
  EXPECT_EQ(detector_.state(), State::kHealthy);
}

// The verdict was due 100 ms after the probe; a Poll 350 ms after it means the controller's
// own loop stalled for 250 ms, long enough that the answer may sit unread: probe again.
TEST_F(FailureDetectorTest, LateVerdictProbesAgainAndTheAnswerKeepsTheEngine) {
  ASSERT_NO_FATAL_FAILURE(SilentUntilProbed());
  clock_.Advance(milliseconds(350));
  EXPECT_EQ(detector_.Poll(), Action::kProbeAgain);
  EXPECT_EQ(detector_.state(), State::kProbing);
  EXPECT_EQ(detector_.late_probes(), 1);
  EXPECT_EQ(detector_.NextDeadline(), clock_.Now() + milliseconds(100));
  detector_.OnHealthReply();
  EXPECT_EQ(detector_.state(), State::kHealthy);
  EXPECT_EQ(detector_.late_probes(), 0);
}

// A loop that stays late still gets a verdict: after kMaxLateProbes late ones, the next is
// given, late or not.
TEST_F(FailureDetectorTest, ALoopThatStaysLateStillDeclaresAHungEngine) {
  ASSERT_NO_FATAL_FAILURE(SilentUntilProbed());
  for (int i = 0; i < FailureDetector::kMaxLateProbes; ++i) {
    clock_.Advance(milliseconds(500));
    EXPECT_EQ(detector_.Poll(), Action::kProbeAgain) << i;
  }
  clock_.Advance(milliseconds(500));
  EXPECT_EQ(detector_.Poll(), Action::kDeclareHung);
  EXPECT_EQ(detector_.state(), State::kHung);
}

// Another engine silent too points at the host (short of CPU) rather than at both engines:
// the verdict is put off by a probe more, kMaxLateProbes at most, then given.
TEST_F(FailureDetectorTest, OthersSilentTooProbesAgainThenDeclares) {
  ASSERT_NO_FATAL_FAILURE(SilentUntilProbed());
  EXPECT_TRUE(detector_.Silent());
  for (int i = 0; i < FailureDetector::kMaxLateProbes; ++i) {
    clock_.Advance(milliseconds(100));
    EXPECT_EQ(detector_.Poll(/*others_silent=*/true), Action::kProbeAgain) << i;
  }
  clock_.Advance(milliseconds(100));
  EXPECT_EQ(detector_.Poll(/*others_silent=*/true), Action::kDeclareHung);
}

// Silent: past suspect_after() with no heartbeat, probed or not yet.
TEST_F(FailureDetectorTest, SilentIsPastSuspectAfter) {
  clock_.Advance(milliseconds(299));
  EXPECT_FALSE(detector_.Silent());
  clock_.Advance(milliseconds(1));
  EXPECT_TRUE(detector_.Silent());
  detector_.OnHeartbeat();
  EXPECT_FALSE(detector_.Silent());
}

// A verdict less than one probe_timeout late is given: the loop ran, the answer had its turn.
TEST_F(FailureDetectorTest, AVerdictSlightlyLateIsGiven) {
  ASSERT_NO_FATAL_FAILURE(SilentUntilProbed());
  clock_.Advance(milliseconds(199));
  EXPECT_EQ(detector_.Poll(), Action::kDeclareHung);
}

TEST_F(FailureDetectorTest, CustomOptionsAndBadValuesAreSanitized) {
  FailureDetector::Options options;
  options.heartbeat_interval = milliseconds(50);
  options.misses = 0;
  options.probe_timeout = Duration::zero();
  FailureDetector detector(clock_, options);
  EXPECT_EQ(detector.suspect_after(), milliseconds(50));
  clock_.Advance(milliseconds(50));
  EXPECT_EQ(detector.Poll(), Action::kSendProbe);
  clock_.Advance(milliseconds(100));
  EXPECT_EQ(detector.Poll(), Action::kDeclareHung);
}

}  // namespace
}  // namespace baton
