#include "router/canary/stall_tracker.h"

#include <chrono>

namespace baton {

StallTracker::Confirmed StallTracker::Confirm(const std::vector<EngineProgress::Stall>& found) {
  Confirmed out;
  std::set<Key> seen;
  std::set<Key> reported;
  for (const EngineProgress::Stall& s : found) {
    const Key key{s.node, s.engine_id};
    seen.insert(key);
    if (seen_.count(key) == 0) continue;  // once more, an interval on
    reported.insert(key);
    if (reported_.count(key) == 0) out.first.push_back(s);
    const auto quiet = std::chrono::duration_cast<std::chrono::milliseconds>(s.quiet).count();
    out.by_node[s.node].push_back(
        {.engine_id = s.engine_id, .streams = s.streams, .quiet_ms = static_cast<uint64_t>(quiet)});
  }
  seen_ = std::move(seen);
  reported_ = std::move(reported);
  return out;
}

void StallTracker::Reset() {
  seen_.clear();
  reported_.clear();
}

}  // namespace baton
