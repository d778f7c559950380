#include "controller/core/progress_watch.h"

namespace baton {

void ProgressWatch::OnReport(uint64_t steps_done, uint32_t work_pending) {
  const TimePoint now = clock_->Now();
  if (!reported_ || steps_done != steps_ || pending_ == 0 || work_pending == 0) since_ = now;
  reported_ = true;
  steps_ = steps_done;
  pending_ = work_pending;
  last_report_ = now;
}

Duration ProgressWatch::still_for() const {
  if (!reported_ || pending_ == 0) return Duration::zero();
  return clock_->Now() - since_;
}

bool ProgressWatch::Stalled() const {
  return reported_ && pending_ > 0 && still_for() >= options_.stall_timeout && Fresh();
}

std::optional<TimePoint> ProgressWatch::NextDeadline() const {
  if (!reported_ || pending_ == 0) return std::nullopt;
  const TimePoint due = since_ + options_.stall_timeout;
  if (due <= clock_->Now() && !Fresh()) return std::nullopt;
  return due;
}

}  // namespace baton
