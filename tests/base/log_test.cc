#include "base/log.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
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

// An unknown BATON_LOG_LEVEL is said once and treated as unset, so that the config's
// log_level still holds (it was ignored, and the config's level with it).
TEST(Log, AnUnknownEnvironmentLevelIsSaidAndIgnored) {
  const char* before = std::getenv("BATON_LOG_LEVEL");
  const std::string saved = before != nullptr ? before : "";
  ::unsetenv("BATON_LOG_LEVEL");
  EXPECT_EQ(EnvironmentLogLevel(), std::nullopt);
  ::setenv("BATON_LOG_LEVEL", "", 1);
  EXPECT_EQ(EnvironmentLogLevel(), std::nullopt);
  ::setenv("BATON_LOG_LEVEL", "warn", 1);
  EXPECT_EQ(EnvironmentLogLevel(), LogLevel::kWarn);
  ::setenv("BATON_LOG_LEVEL", "loud", 1);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(EnvironmentLogLevel(), std::nullopt);
  EXPECT_EQ(EnvironmentLogLevel(), std::nullopt);
  const std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find(" WARN log: BATON_LOG_LEVEL=loud names no level"), std::string::npos) << said;
  EXPECT_EQ(said.find("names no level"), said.rfind("names no level")) << "said once: " << said;
  if (before != nullptr) {
    ::setenv("BATON_LOG_LEVEL", saved.c_str(), 1);
  } else {
    ::unsetenv("BATON_LOG_LEVEL");
  }
}

}  // namespace
}  // namespace baton
