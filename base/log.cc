#include "base/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>

namespace baton {
namespace {

LogLevel InitialLevel() { return EnvironmentLogLevel().value_or(LogLevel::kInfo); }

std::atomic<int>& LevelStorage() {
  static std::atomic<int> level{static_cast<int>(InitialLevel())};
  return level;
}

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "DEBUG";
    case LogLevel::kInfo:
      return "INFO";
    case LogLevel::kWarn:
      return "WARN";
    case LogLevel::kError:
      return "ERROR";
  }
  return "?";
}

}  // namespace

void SetLogLevel(LogLevel level) { LevelStorage().store(static_cast<int>(level)); }
LogLevel GetLogLevel() { return static_cast<LogLevel>(LevelStorage().load()); }

bool ParseLogLevel(std::string_view text, LogLevel* out) {
  if (text == "debug")
    *out = LogLevel::kDebug;
  else if (text == "info")
    *out = LogLevel::kInfo;
  else if (text == "warn")
    *out = LogLevel::kWarn;
  else if (text == "error")
    *out = LogLevel::kError;
  else
    return false;
  return true;
}

std::optional<LogLevel> EnvironmentLogLevel() {
  const char* env = std::getenv("BATON_LOG_LEVEL");
  if (env == nullptr || *env == '\0') return std::nullopt;
  LogLevel level;
  if (ParseLogLevel(env, &level)) return level;
  static std::atomic<bool> said{false};
  if (!said.exchange(true)) {  // a LogLine, not BATON_LOG: the level may be being chosen
    LogLine(LogLevel::kWarn, "log")
        << "BATON_LOG_LEVEL=" << env << " names no level (debug, info, warn or error): ignored";
  }
  return std::nullopt;
}

LogLine::LogLine(LogLevel level, std::string_view component) : level_(level) {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  tm parts{};
  gmtime_r(&ts.tv_sec, &parts);
  char stamp[96];
  std::snprintf(stamp, sizeof(stamp), "%04d-%02d-%02dT%02d:%02d:%02d.%06ldZ", parts.tm_year + 1900,
                parts.tm_mon + 1, parts.tm_mday, parts.tm_hour, parts.tm_min, parts.tm_sec,
                ts.tv_nsec / 1000);
  stream_ << stamp << ' ' << LevelName(level) << ' ' << component << ": ";
}

LogLine::~LogLine() {
  stream_ << '\n';
  const std::string line = stream_.str();
  ssize_t unused = ::write(STDERR_FILENO, line.data(), line.size());
  (void)unused;
  (void)level_;
}

}  // namespace baton
