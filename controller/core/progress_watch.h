// ProgressWatch: decides when an engine's compute stands still, for one engine that reports
// its progress (proto::Progress, protocol 11).
//
// The heartbeat thread of the engine SDK runs apart from the compute loop, so heartbeats go on
// while a step deadlocks or a kernel or collective never ends (FailureDetector sees nothing).
// An engine that reports progress says, with each heartbeat, how many compute steps it has
// finished and how many requests it holds unfinished. The compute is stalled when work is
// pending and the step count has not moved for `stall_timeout`, counted from the later of the
// step count's last change and the moment work became pending (an idle engine takes no steps
// and is never stalled). The timeout bounds one step: it must exceed the engine's longest step
// (the first prefill of the longest prompt), or that step is taken for a hang.
//
// A verdict needs a fresh report (one within `fresh_within`, the heartbeat silence the failure
// detector tolerates): an engine whose reports stopped is the failure detector's to judge, and
// a controller that stalled itself judges nothing before it has read what the engine sent
// meanwhile.
//
// Pure logic over an injected Clock; the Clock must outlive it. Ownership: the engine's
// record holds one from its first report. Thread: the Coordinator's.
#pragma once

#include <cstdint>
#include <optional>

#include "base/clock.h"

namespace baton {

class ProgressWatch {
 public:
  struct Options {
    Duration stall_timeout = std::chrono::seconds(30);  // > 0
    Duration fresh_within = std::chrono::milliseconds(300);
  };

  ProgressWatch(const Clock& clock, Options options) : clock_(&clock), options_(options) {}

  // A report arrived: `steps_done` finished steps, `work_pending` requests unfinished.
  void OnReport(uint64_t steps_done, uint32_t work_pending);

  // True when work is pending, no step has finished for stall_timeout and the latest report
  // is fresh.
  bool Stalled() const;
  // When Stalled() may next turn true on the clock alone (nullopt: not before another report).
  std::optional<TimePoint> NextDeadline() const;

  uint64_t steps_done() const { return steps_; }
  uint32_t work_pending() const { return pending_; }
  // How long the step count has stood still with work pending (zero while idle).
  Duration still_for() const;

 private:
  bool Fresh() const { return clock_->Now() - last_report_ <= options_.fresh_within; }

  const Clock* clock_;
  Options options_;
  bool reported_ = false;
  uint64_t steps_ = 0;
  uint32_t pending_ = 0;
  TimePoint since_{};  // the step count's last change, or when work became pending
  TimePoint last_report_{};
};

}  // namespace baton
