#include "router/canary/engine_progress.h"

#include <algorithm>
#include <utility>

namespace baton {

uint64_t EngineProgress::Begin(const std::string& node, uint64_t engine_id, TimePoint now) {
  MutexLock lock(mu_);
  const uint64_t id = next_id_++;
  streams_[id] = Stream{.node = node, .engine_id = engine_id, .last = now};
  return id;
}

void EngineProgress::Advanced(uint64_t id, TimePoint now) {
  MutexLock lock(mu_);
  auto it = streams_.find(id);
  if (it != streams_.end()) it->second.last = std::max(it->second.last, now);
}

void EngineProgress::End(uint64_t id) {
  MutexLock lock(mu_);
  streams_.erase(id);
}

std::vector<EngineProgress::Stall> EngineProgress::Stalled(TimePoint now, Duration quiet) const {
  struct Seen {
    uint32_t streams = 0;
    TimePoint last{};
  };
  std::map<std::pair<std::string, uint64_t>, Seen> engines;
  {
    MutexLock lock(mu_);
    for (const auto& [id, s] : streams_) {
      Seen& e = engines[{s.node, s.engine_id}];
      e.last = e.streams == 0 ? s.last : std::max(e.last, s.last);
      ++e.streams;
    }
  }
  std::vector<Stall> out;
  for (const auto& [engine, seen] : engines) {
    if (now - seen.last >= quiet) {
      out.push_back(Stall{.node = engine.first,
                          .engine_id = engine.second,
                          .streams = seen.streams,
                          .quiet = now - seen.last});
    }
  }
  return out;
}

}  // namespace baton
