#include "controller/core/crash_loop_guard.h"

#include <algorithm>

#include "base/log.h"

namespace baton {

CrashLoopGuard::CrashLoopGuard(const Clock& clock, Options options)
    : clock_(&clock), options_(options), backoff_until_(TimePoint::min()) {
  options_.max_failures = std::max(options_.max_failures, 1);
  options_.initial_backoff = std::max(options_.initial_backoff, Duration(1));
  options_.max_backoff = std::max(options_.max_backoff, options_.initial_backoff);
  options_.min_restart_interval = std::max(options_.min_restart_interval, Duration(1));
}

bool CrashLoopGuard::Quiet(TimePoint now) const {
  return has_failure_ && now - last_failure_ >= options_.quiet_period && now >= backoff_until_;
}

void CrashLoopGuard::Expire(TimePoint now) {
  while (!failures_.empty() && now - failures_.front() >= options_.window) failures_.pop_front();
  if (Quiet(now)) level_ = 0;
}

int CrashLoopGuard::recent_failures() const {
  const TimePoint now = clock_->Now();
  return static_cast<int>(std::count_if(failures_.begin(), failures_.end(),
                                        [&](TimePoint at) { return now - at < options_.window; }));
}

bool CrashLoopGuard::RecordFailure() {
  const TimePoint now = clock_->Now();
  Expire(now);
  failures_.push_back(now);
  has_failure_ = true;
  last_failure_ = now;
  ++total_failures_;
  if (static_cast<int>(failures_.size()) < options_.max_failures) return false;

  Duration backoff = options_.initial_backoff;
  for (int i = 0; i < level_ && backoff < options_.max_backoff; ++i) backoff *= 2;
  backoff = std::min(backoff, options_.max_backoff);
  backoff_until_ = std::max(backoff_until_, now + backoff);
  ++level_;
  failures_.clear();
  BATON_LOG(WARN, "crashloop") << options_.max_failures << " failures within "
                               << MillisBetween(TimePoint(), TimePoint(options_.window))
                               << " ms: restarts held back for "
                               << MillisBetween(TimePoint(), TimePoint(backoff)) << " ms (level "
                               << level_ << ")";
  return true;
}

TimePoint CrashLoopGuard::NextRestartAt() const {
  TimePoint at = backoff_until_;
  if (has_restart_) at = std::max(at, last_restart_ + options_.min_restart_interval);
  return at;
}

bool CrashLoopGuard::TryStartRestart() {
  const TimePoint now = clock_->Now();
  Expire(now);
  if (now < NextRestartAt()) return false;
  has_restart_ = true;
  last_restart_ = now;
  return true;
}

}  // namespace baton
