#include "base/clock.h"

#include <gtest/gtest.h>

#include "base/log.h"

namespace baton {
namespace {

using std::chrono::milliseconds;

TEST(ClockTest, FakeClockMovesOnlyWhenAdvanced) {
  FakeClock clock;
  const TimePoint t0 = clock.Now();
  EXPECT_EQ(clock.Now(), t0);
  clock.Advance(milliseconds(250));
  EXPECT_DOUBLE_EQ(MillisBetween(t0, clock.Now()), 250.0);
  clock.Set(t0);
  EXPECT_EQ(clock.Now(), t0);
}

TEST(ClockTest, RealClockIsMonotonic) {
  const Clock& clock = RealClock::Get();
  TimePoint a = clock.Now();
  TimePoint b = clock.Now();
  EXPECT_LE(a, b);
}

TEST(LogTest, ParsesLevels) {
  LogLevel level;
  EXPECT_TRUE(ParseLogLevel("warn", &level));
  EXPECT_EQ(level, LogLevel::kWarn);
  EXPECT_FALSE(ParseLogLevel("loud", &level));
}

TEST(LogTest, LineHasLevelComponentAndMessage) {
  testing::internal::CaptureStderr();
  BATON_LOG(INFO, "unit") << "value=" << 42;
  BATON_LOG(DEBUG, "unit") << "hidden";
  const std::string out = testing::internal::GetCapturedStderr();
  EXPECT_NE(out.find(" INFO unit: value=42\n"), std::string::npos);
  EXPECT_EQ(out.find("hidden"), std::string::npos);
}

}  // namespace
}  // namespace baton
