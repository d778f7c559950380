// Logging: one line per event on stderr, "TIMESTAMP LEVEL component: message".
//
//   BATON_LOG(INFO, "loader") << "filled " << bytes << " bytes";
//   BATON_LOG_AT(planned ? LogLevel::kInfo : LogLevel::kWarn, "coordinator") << ...;
//
// The line is assembled in a buffer and written with a single write(2), so lines from
// several threads or processes never interleave. The minimum level comes from
// SetLogLevel() or the BATON_LOG_LEVEL environment variable (debug|info|warn|error).
// Thread-safe.
#pragma once

#include <optional>
#include <sstream>
#include <string_view>

namespace baton {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
// Parses "debug", "info", "warn", "error"; returns false on anything else.
bool ParseLogLevel(std::string_view text, LogLevel* out);
// The level $BATON_LOG_LEVEL names, which wins over a program's own setting (a config's
// log_level); nullopt when it is unset or empty, or names no level: such a value is said once
// on stderr (WARN) and otherwise ignored, as if unset.
std::optional<LogLevel> EnvironmentLogLevel();

class LogLine {
 public:
  LogLine(LogLevel level, std::string_view component);
  ~LogLine();
  LogLine(const LogLine&) = delete;
  LogLine& operator=(const LogLine&) = delete;

  template <typename T>
  LogLine& operator<<(const T& value) {
    stream_ << value;
    return *this;
  }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

// Turns a LogLine expression into void so both arms of BATON_LOG's ?: agree.
struct LogVoidify {
  void operator&(const LogLine&) const {}
};

}  // namespace baton

#define BATON_LOG_LEVEL_DEBUG ::baton::LogLevel::kDebug
#define BATON_LOG_LEVEL_INFO ::baton::LogLevel::kInfo
#define BATON_LOG_LEVEL_WARN ::baton::LogLevel::kWarn
#define BATON_LOG_LEVEL_ERROR ::baton::LogLevel::kError

// An expression, safe under an unbraced if/else.
#define BATON_LOG(level, component)                  \
  (BATON_LOG_LEVEL_##level < ::baton::GetLogLevel()) \
      ? (void)0                                      \
      : ::baton::LogVoidify() & ::baton::LogLine(BATON_LOG_LEVEL_##level, component)

// BATON_LOG at a level chosen at run time (a ::baton::LogLevel expression, evaluated twice).
#define BATON_LOG_AT(level, component) \
  ((level) < ::baton::GetLogLevel())   \
      ? (void)0                        \
      : ::baton::LogVoidify() & ::baton::LogLine((level), component)
