// ProgressWatch on a FakeClock: work pending and a step count that stands still for the
// timeout is a stall; idle, moving, stale or not yet long enough is not.
#include "controller/core/progress_watch.h"

#include <gtest/gtest.h>

namespace baton {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

class ProgressWatchTest : public ::testing::Test {
 protected:
  // Reports (steps, pending) every 100 ms for `d`.
  void ReportFor(Duration d, uint64_t steps, uint32_t pending, uint64_t step_every = 0) {
    for (Duration t{}; t < d; t += milliseconds(100)) {
      watch_.OnReport(steps, pending);
      steps += step_every;
      clock_.Advance(milliseconds(100));
    }
    watch_.OnReport(steps, pending);
  }

  FakeClock clock_;
  ProgressWatch watch_{clock_, {.stall_timeout = seconds(2), .fresh_within = milliseconds(300)}};
};

TEST_F(ProgressWatchTest, StepsStandingStillWithWorkPendingIsAStallAfterTheTimeout) {
  ReportFor(milliseconds(1900), 7, 2);
  EXPECT_FALSE(watch_.Stalled());
  EXPECT_EQ(watch_.NextDeadline(), clock_.Now() + milliseconds(100));
  ReportFor(milliseconds(100), 7, 2);
  EXPECT_TRUE(watch_.Stalled());
  EXPECT_EQ(watch_.still_for(), seconds(2));
  EXPECT_EQ(watch_.steps_done(), 7u);
  EXPECT_EQ(watch_.work_pending(), 2u);
}

TEST_F(ProgressWatchTest, AnIdleEngineIsNeverStalled) {
  ReportFor(seconds(10), 7, 0);
  EXPECT_FALSE(watch_.Stalled());
  EXPECT_EQ(watch_.NextDeadline(), std::nullopt);
  EXPECT_EQ(watch_.still_for(), Duration::zero());
}

TEST_F(ProgressWatchTest, MovingStepsAreNoStall) {
  ReportFor(seconds(10), 7, 3, /*step_every=*/1);
  EXPECT_FALSE(watch_.Stalled());
}

// The clock starts when work comes, not at the last step: a long first prefill after an idle
// spell has the whole timeout.
TEST_F(ProgressWatchTest, TheTimeoutCountsFromWhenWorkCame) {
  ReportFor(seconds(10), 7, 0);
  ReportFor(milliseconds(1900), 7, 1);
  EXPECT_FALSE(watch_.Stalled());
  ReportFor(milliseconds(100), 7, 1);
  EXPECT_TRUE(watch_.Stalled());
}

// A step that ends just within the timeout restarts it.
TEST_F(ProgressWatchTest, AStepWithinTheTimeoutRestartsIt) {
  ReportFor(milliseconds(1900), 7, 1);
  ReportFor(milliseconds(1900), 8, 1);
  EXPECT_FALSE(watch_.Stalled());
  ReportFor(milliseconds(100), 8, 1);
  EXPECT_TRUE(watch_.Stalled());
}

// Reports that stopped (or a controller that stalled itself and has not read the latest
// ones) give no verdict, and no deadline to wake for.
TEST_F(ProgressWatchTest, AStaleReportGivesNoVerdict) {
  ReportFor(milliseconds(1000), 7, 2);
  clock_.Advance(seconds(5));
  EXPECT_FALSE(watch_.Stalled());
  EXPECT_EQ(watch_.NextDeadline(), std::nullopt);
  watch_.OnReport(7, 2);  // fresh again, still standing
  EXPECT_TRUE(watch_.Stalled());
}

}  // namespace
}  // namespace baton
