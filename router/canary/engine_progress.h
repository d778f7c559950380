// EngineProgress: whether the engines this router streams from still make progress, for the
// controller's hang detection (proto::EngineStalled).
//
// An engine whose compute hangs (a deadlocked step, a kernel that never ends) may still send
// its heartbeats from another thread: the controller sees it alive while its requests stand
// still. The router sees them stand still. RelayedRequest calls Begin() when an attempt's
// stream has sent its first event (its prefill is done: from then on an engine that works
// sends a token every step), Advanced() with each later event, and End() when the attempt
// ends. Stalled() names each engine, by node and engine id (a fleet router's engine ids are
// each node's own; the router's own controller's engines are node ""), with at least one such
// stream where none has had an event for `quiet` or more: an engine that batches its
// sequences advances them all together, so one stream that moves is progress.
//
// Ids come from Begin(); End() of an unknown id does nothing. Thread-safe (one mutex).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/mutex.h"

namespace baton {

class EngineProgress {
 public:
  struct Stall {
    std::string node;  // "" for the router's own controller's engines
    uint64_t engine_id = 0;
    uint32_t streams = 0;  // streams that had begun answering
    Duration quiet{};      // since the last event on any of them
  };

  uint64_t Begin(const std::string& node, uint64_t engine_id, TimePoint now);
  void Advanced(uint64_t id, TimePoint now);
  void End(uint64_t id);
  // Engines whose every begun stream has been quiet for `quiet` or more, by (node, engine id)
  // ascending.
  std::vector<Stall> Stalled(TimePoint now, Duration quiet) const;

 private:
  struct Stream {
    std::string node;
    uint64_t engine_id = 0;
    TimePoint last{};
  };
  mutable Mutex mu_;
  uint64_t next_id_ BATON_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Stream> streams_ BATON_GUARDED_BY(mu_);
};

}  // namespace baton
