#include "base/log.h"

#include <gtest/gtest.h>

#include <string>

namespace baton {
namespace {

// BATON_LOG_AT takes its level at run time: a line at or above the minimum is written with
// that level's name, one below it is not written (nor its operands formatted).
TEST(Log, ALevelChosenAtRunTime) {
  const LogLevel before = GetLogLevel();
  SetLogLevel(LogLevel::kInfo);
  int formatted = 0;
  const auto count = [&formatted] { return ++formatted; };
  for (const bool planned : {true, false}) {
    ::testing::internal::CaptureStderr();
    BATON_LOG_AT(planned ? LogLevel::kInfo : LogLevel::kWarn, "test") << "fenced " << count();
    const std::string line = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(line.find(planned ? " INFO test: fenced " : " WARN test: fenced "), std::string::npos)
        << line;
  }
  ::testing::internal::CaptureStderr();
  BATON_LOG_AT(LogLevel::kDebug, "test") << "hidden " << count();
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  EXPECT_EQ(formatted, 2);
  SetLogLevel(before);
}

}  // namespace
}  // namespace baton
