// EngineOutcomes: what this router saw of each engine, as cumulative counters by engine id,
// for the controller's canary judgement (RouterReport) and /metrics.
//
// RelayedRequest records every engine attempt once, when it ends: RecordSucceeded() with the
// time from the request's arrival at the router to its last byte, RecordFailed() for an
// attempt that failed (connection refused or lost, a stall past a timeout, a broken stream, an
// answer 5xx), RecordEnded() for one that ended neither way (the client left, an answer the
// router could not relay, a refused replay). Each call adds one to `requests`; counters never
// go down, and an engine id stays once seen (a few per failover or upgrade).
// ShadowComparer records, on a canary's engine id, each of its answers compared with the
// primary's (RecordComparison: `compared`, and `disagreed` when the token ids differed); a
// comparison is not an attempt and leaves `requests` alone.
//
// Thread-safe (one mutex; each record is a few additions).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "base/clock.h"
#include "proto/messages.h"

namespace baton {

class EngineOutcomes {
 public:
  void RecordSucceeded(uint64_t engine_id, Duration arrival_to_last_byte);
  void RecordFailed(uint64_t engine_id);
  void RecordEnded(uint64_t engine_id);
  void RecordComparison(uint64_t canary_engine_id, bool agreed);

  // Every engine seen, by engine id ascending.
  std::vector<proto::EngineOutcome> Snapshot() const;

 private:
  proto::EngineOutcome& At(uint64_t engine_id);  // mu_ held

  mutable std::mutex mu_;
  std::map<uint64_t, proto::EngineOutcome> engines_;
};

}  // namespace baton
