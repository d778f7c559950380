#include "base/clock.h"

namespace baton {

TimePoint RealClock::Now() const {
  return std::chrono::time_point_cast<Duration>(std::chrono::steady_clock::now());
}

RealClock& RealClock::Get() {
  static RealClock clock;
  return clock;
}

}  // namespace baton
