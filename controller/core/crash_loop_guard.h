// CrashLoopGuard: keeps a failing pair from restarting engines in a tight loop.
//
// Every engine failure (death, confirmed hang, error report) is recorded. When max_failures
// happen within `window`, the guard trips: restarts are held back for a backoff that starts
// at initial_backoff and doubles with each consecutive trip up to max_backoff; after
// quiet_period without a failure the backoff level resets. Independently of any trip,
// consecutive restarts are at least min_restart_interval apart, so TryStartRestart can never
// say yes twice without time passing. While tripped the pair shows a *_backoff state and
// NextRestartAt() in `batonctl status`.
//
// Pure logic over an injected Clock. Ownership: the controller owns one per pair; the Clock
// must outlive it. Thread: io_context thread only.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>

#include "base/clock.h"

namespace baton {

class CrashLoopGuard {
 public:
  struct Options {
    int max_failures = 5;
    Duration window = std::chrono::seconds(60);
    Duration initial_backoff = std::chrono::seconds(1);
    Duration max_backoff = std::chrono::seconds(60);
    Duration quiet_period = std::chrono::seconds(120);
    Duration min_restart_interval = std::chrono::milliseconds(10);
  };

  CrashLoopGuard(const Clock& clock, Options options);
  explicit CrashLoopGuard(const Clock& clock) : CrashLoopGuard(clock, Options()) {}

  // Records one failure now. Returns true if this failure tripped the guard.
  bool RecordFailure();

  // If a restart may start now, records it and returns true; otherwise returns false and
  // NextRestartAt() says when to ask again (always later than now).
  bool TryStartRestart();

  // True while restarts are held back by a trip.
  bool InBackoff() const { return clock_->Now() < backoff_until_; }
  // The earliest time TryStartRestart can succeed.
  TimePoint NextRestartAt() const;
  // Failures counted in the current window.
  int recent_failures() const { return static_cast<int>(failures_.size()); }
  // Consecutive trips since the last quiet period (0: never tripped).
  int level() const { return level_; }
  uint64_t total_failures() const { return total_failures_; }
  TimePoint backoff_until() const { return backoff_until_; }

 private:
  void Expire(TimePoint now);

  const Clock* clock_;
  Options options_;
  std::deque<TimePoint> failures_;
  int level_ = 0;
  uint64_t total_failures_ = 0;
  bool has_failure_ = false;
  TimePoint last_failure_;
  TimePoint backoff_until_;
  bool has_restart_ = false;
  TimePoint last_restart_;
};

}  // namespace baton
