// CrashLoopGuard: keeps a failing pair from restarting engines in a tight loop.
//
// Every engine failure (death, confirmed hang, error report) is recorded. When max_failures
// happen within `window`, the guard trips: restarts are held back for a backoff that starts
// at initial_backoff and doubles with each consecutive trip up to max_backoff; after
// quiet_period without a failure the backoff level resets. Independently of any trip,
// consecutive restarts are at least min_restart_interval apart, so TryStartRestart can never
// say yes twice without time passing. While tripped the pair shows a *_backoff state and
// NextRestartAt() in `batonctl status`. What it reports (recent_failures, level) is read at the
// clock's now, not at its last event: status never counts a failure older than the window.
//
// Pure logic over an injected Clock. Ownership: the controller owns one per pair; the Clock
// must outlive it. Thread: io_context thread only.
#pragma once

#include <algorithm>
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
  // Ends a backoff now (an operator's new engine command deserves its launch): the failures
  // and the level stay, so the next trip backs off longer.
  void LiftBackoff() { backoff_until_ = std::min(backoff_until_, clock_->Now()); }
  // The earliest time TryStartRestart can succeed.
  TimePoint NextRestartAt() const;
  // Failures counted in the current window, now: those less than `window` old, since the last
  // trip (a trip starts the count again; max_failures of them trip it).
  int recent_failures() const;
  // Consecutive trips since the last quiet period, now (0: never tripped, or quiet since).
  int level() const { return Quiet(clock_->Now()) ? 0 : level_; }
  uint64_t total_failures() const { return total_failures_; }
  TimePoint backoff_until() const { return backoff_until_; }

 private:
  void Expire(TimePoint now);
  // True when quiet_period has passed since the last failure and no backoff holds: the level
  // is back to 0.
  bool Quiet(TimePoint now) const;

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
