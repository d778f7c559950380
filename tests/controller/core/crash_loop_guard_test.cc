#include "controller/core/crash_loop_guard.h"

#include <gtest/gtest.h>

namespace baton {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

CrashLoopGuard::Options SmallOptions() {
  CrashLoopGuard::Options options;
  options.max_failures = 3;
  options.window = seconds(10);
  options.initial_backoff = seconds(1);
  options.max_backoff = seconds(4);
  options.quiet_period = seconds(30);
  options.min_restart_interval = milliseconds(10);
  return options;
}

TEST(CrashLoopGuardTest, FewFailuresDoNotTrip) {
  FakeClock clock;
  CrashLoopGuard guard(clock, SmallOptions());
  EXPECT_FALSE(guard.RecordFailure());
  clock.Advance(seconds(1));
  EXPECT_FALSE(guard.RecordFailure());
  EXPECT_FALSE(guard.InBackoff());
  EXPECT_TRUE(guard.TryStartRestart());
  // Failures older than the window are forgotten.
  clock.Advance(seconds(10));
  EXPECT_FALSE(guard.RecordFailure());
  EXPECT_EQ(guard.recent_failures(), 1);
}

// What `batonctl status` reads is the count now, not at the last event: a failure older than
// the window is no longer counted though nothing happened since.
TEST(CrashLoopGuardTest, RecentFailuresExpireWithoutAnEvent) {
  FakeClock clock;
  CrashLoopGuard guard(clock, SmallOptions());
  EXPECT_FALSE(guard.RecordFailure());
  clock.Advance(seconds(4));
  EXPECT_FALSE(guard.RecordFailure());
  EXPECT_EQ(guard.recent_failures(), 2);
  clock.Advance(seconds(6) - milliseconds(1));
  EXPECT_EQ(guard.recent_failures(), 2);
  clock.Advance(milliseconds(1));
  EXPECT_EQ(guard.recent_failures(), 1);
  clock.Advance(seconds(71));
  EXPECT_EQ(guard.recent_failures(), 0);
}

// A trip starts a new window: the failures that tripped it are not counted again.
TEST(CrashLoopGuardTest, ATripStartsANewWindow) {
  FakeClock clock;
  CrashLoopGuard guard(clock, SmallOptions());
  for (int i = 0; i < 2; ++i) EXPECT_FALSE(guard.RecordFailure());
  EXPECT_TRUE(guard.RecordFailure());
  EXPECT_EQ(guard.recent_failures(), 0);
  clock.Advance(milliseconds(100));
  EXPECT_FALSE(guard.RecordFailure());
  EXPECT_EQ(guard.recent_failures(), 1);
}

TEST(CrashLoopGuardTest, TripsAndBacksOffExponentiallyWithCap) {
  FakeClock clock;
  CrashLoopGuard guard(clock, SmallOptions());
  const seconds expected[] = {seconds(1), seconds(2), seconds(4), seconds(4)};
  for (seconds backoff : expected) {
    EXPECT_FALSE(guard.RecordFailure());
    EXPECT_FALSE(guard.RecordFailure());
    EXPECT_TRUE(guard.RecordFailure());
    EXPECT_TRUE(guard.InBackoff());
    EXPECT_EQ(guard.NextRestartAt(), clock.Now() + backoff);
    EXPECT_FALSE(guard.TryStartRestart());
    clock.Advance(backoff - milliseconds(1));
    EXPECT_FALSE(guard.TryStartRestart());
    clock.Advance(milliseconds(1));
    EXPECT_FALSE(guard.InBackoff());
    EXPECT_TRUE(guard.TryStartRestart());
  }
  EXPECT_EQ(guard.level(), 4);
}

TEST(CrashLoopGuardTest, QuietPeriodResetsTheLevel) {
  FakeClock clock;
  CrashLoopGuard guard(clock, SmallOptions());
  for (int trip = 0; trip < 2; ++trip) {
    for (int i = 0; i < 3; ++i) (void)guard.RecordFailure();
    clock.Advance(seconds(5));
  }
  EXPECT_EQ(guard.level(), 2);
  clock.Advance(seconds(30));
  for (int i = 0; i < 3; ++i) (void)guard.RecordFailure();
  EXPECT_EQ(guard.level(), 1);
  EXPECT_EQ(guard.NextRestartAt(), clock.Now() + seconds(1));
}

// The level read after a quiet period is 0, though no failure or restart came to reset it.
TEST(CrashLoopGuardTest, TheLevelReadsZeroAfterAQuietPeriodWithoutAnEvent) {
  FakeClock clock;
  CrashLoopGuard guard(clock, SmallOptions());
  for (int i = 0; i < 3; ++i) (void)guard.RecordFailure();
  EXPECT_EQ(guard.level(), 1);
  clock.Advance(seconds(30) - milliseconds(1));
  EXPECT_EQ(guard.level(), 1);
  clock.Advance(milliseconds(1));
  EXPECT_EQ(guard.level(), 0);
  for (int i = 0; i < 3; ++i) (void)guard.RecordFailure();
  EXPECT_EQ(guard.level(), 1);
  EXPECT_EQ(guard.NextRestartAt(), clock.Now() + seconds(1));
}

TEST(CrashLoopGuardTest, NeverSaysRestartTwiceWithoutTimePassing) {
  FakeClock clock;
  CrashLoopGuard guard(clock, SmallOptions());
  EXPECT_TRUE(guard.TryStartRestart());
  for (int i = 0; i < 1000; ++i) {
    EXPECT_FALSE(guard.TryStartRestart());
    EXPECT_GT(guard.NextRestartAt(), clock.Now());
  }
  clock.Advance(milliseconds(10));
  EXPECT_TRUE(guard.TryStartRestart());
}

TEST(CrashLoopGuardTest, RestartsUnderContinuousFailureAreBounded) {
  // An engine that dies at once on every start: however often the controller polls, the
  // number of restarts in a minute stays small.
  FakeClock clock;
  CrashLoopGuard guard(clock, SmallOptions());
  int restarts = 0;
  for (int tick = 0; tick < 60000; ++tick) {  // 1 ms polls for 60 s
    if (guard.TryStartRestart()) {
      ++restarts;
      (void)guard.RecordFailure();
    }
    clock.Advance(milliseconds(1));
  }
  // 3 quick restarts, then backoffs of 1, 2, 4, 4, ... seconds.
  EXPECT_LE(restarts, 3 * 17);
  EXPECT_GE(restarts, 3 * 5);
}

}  // namespace
}  // namespace baton
