#include "controller/core/failure_detector.h"

namespace baton {

FailureDetector::FailureDetector(const Clock& clock, Options options)
    : clock_(&clock), options_(options), last_heartbeat_(clock.Now()) {
  if (options_.misses < 1) options_.misses = 1;
  if (options_.heartbeat_interval <= Duration::zero()) {
    options_.heartbeat_interval = Options().heartbeat_interval;
  }
  if (options_.probe_timeout <= Duration::zero()) options_.probe_timeout = Options().probe_timeout;
}

void FailureDetector::OnHeartbeat() {
  if (state_ == State::kHung) return;
  last_heartbeat_ = clock_->Now();
  state_ = State::kHealthy;
  late_probes_ = 0;
}

bool FailureDetector::Silent() const {
  return state_ == State::kProbing || (state_ == State::kHealthy && PastSuspect(clock_->Now()));
}

FailureDetector::Action FailureDetector::Poll(bool others_silent) {
  const TimePoint now = clock_->Now();
  switch (state_) {
    case State::kHealthy:
      if (!PastSuspect(now)) return Action::kNone;
      state_ = State::kProbing;
      probe_sent_ = now;
      return Action::kSendProbe;
    case State::kProbing:
      if (now - probe_sent_ < options_.probe_timeout) return Action::kNone;
      if ((now - probe_sent_ >= 2 * options_.probe_timeout || others_silent) &&
          late_probes_ < kMaxLateProbes) {
        ++late_probes_;
        probe_sent_ = now;
        return Action::kProbeAgain;
      }
      state_ = State::kHung;
      return Action::kDeclareHung;
    case State::kHung:
      return Action::kNone;
  }
  return Action::kNone;
}

TimePoint FailureDetector::NextDeadline() const {
  switch (state_) {
    case State::kHealthy:
      return last_heartbeat_ + suspect_after();
    case State::kProbing:
      return probe_sent_ + options_.probe_timeout;
    case State::kHung:
      return TimePoint::max();
  }
  return TimePoint::max();
}

const char* ToString(FailureDetector::State state) {
  switch (state) {
    case FailureDetector::State::kHealthy:
      return "healthy";
    case FailureDetector::State::kProbing:
      return "probing";
    case FailureDetector::State::kHung:
      return "hung";
  }
  return "unknown";
}

}  // namespace baton
