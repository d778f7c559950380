// Clock: the injected source of time for every timeout, detector and ramp.
//
// Production code takes a Clock& and never calls std::chrono::steady_clock directly, so that
// tests drive time with FakeClock and never sleep. RealClock reads the monotonic clock and
// is thread-safe. FakeClock only moves when Advance()/Set() is called; it is thread-safe too
// (an atomic), so a test thread may advance it while the code under test reads it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace baton {

using Duration = std::chrono::nanoseconds;
using TimePoint = std::chrono::time_point<std::chrono::steady_clock, Duration>;

class Clock {
 public:
  virtual ~Clock() = default;
  virtual TimePoint Now() const = 0;
};

class RealClock final : public Clock {
 public:
  TimePoint Now() const override;
  // A process-wide instance, for places that have no clock injected (command-line tools).
  static RealClock& Get();
};

class FakeClock final : public Clock {
 public:
  explicit FakeClock(TimePoint start = TimePoint(std::chrono::seconds(1000)))
      : now_(start.time_since_epoch().count()) {}
  TimePoint Now() const override { return TimePoint(Duration(now_.load())); }
  void Advance(Duration d) { now_.fetch_add(d.count()); }
  void Set(TimePoint t) { now_.store(t.time_since_epoch().count()); }

 private:
  std::atomic<int64_t> now_;
};

// Milliseconds between two time points, as a double (for reports and metrics).
inline double MillisBetween(TimePoint from, TimePoint to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

}  // namespace baton
