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
// A fleet router keeps them by node as well (engine ids are a node's own): the overloads
// with `node`; those without are node "" (the router's own controller).
//
// Thread-safe (one mutex; each record is a few additions).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "base/clock.h"
#include "base/mutex.h"
#include "proto/messages.h"

namespace baton {

class EngineOutcomes {
 public:
  void RecordSucceeded(const std::string& node, uint64_t engine_id, Duration arrival_to_last_byte);
  void RecordFailed(const std::string& node, uint64_t engine_id);
  void RecordEnded(const std::string& node, uint64_t engine_id);
  void RecordComparison(const std::string& node, uint64_t canary_engine_id, bool agreed);
  void RecordSucceeded(uint64_t engine_id, Duration d) { RecordSucceeded("", engine_id, d); }
  void RecordFailed(uint64_t engine_id) { RecordFailed("", engine_id); }
  void RecordEnded(uint64_t engine_id) { RecordEnded("", engine_id); }
  void RecordComparison(uint64_t id, bool agreed) { RecordComparison("", id, agreed); }

  // Every engine of `node` seen, by engine id ascending.
  std::vector<proto::EngineOutcome> Snapshot(const std::string& node = "") const;
  // The nodes with an engine seen, by name.
  std::vector<std::string> Nodes() const;

 private:
  proto::EngineOutcome& At(const std::string& node, uint64_t engine_id) BATON_REQUIRES(mu_);

  mutable Mutex mu_;
  std::map<std::pair<std::string, uint64_t>, proto::EngineOutcome> engines_ BATON_GUARDED_BY(mu_);
};

}  // namespace baton
