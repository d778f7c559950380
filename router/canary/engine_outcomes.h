// EngineOutcomes: what this router saw of each engine, as cumulative counters by engine id,
// for the controller's canary judgement (RouterReport) and /metrics.
//
// RelayedRequest records every engine attempt once, when it ends: RecordSucceeded() with the
// time from the request's arrival at the router to its last byte, RecordFailed() for an
// attempt that failed (connection refused or lost, a stall past a timeout, a broken stream, an
// answer 5xx), RecordEnded() for one that ended neither way (the client left, an answer the
// router could not relay, a refused replay). Each call adds one to `requests`; counters never
// go down while an engine is kept.
// ShadowComparer records, on a canary's engine id, each of its answers compared with the
// primary's (RecordComparison: `compared`, and `disagreed` when the token ids differed); a
// comparison is not an attempt and leaves `requests` alone.
//
// Pruning: engine ids only grow (a few new ones per failover or upgrade), so a router that
// lives for months would report and export every engine it ever saw. SetListed() tells which
// engines each node's route table lists now; Prune() forgets an engine that no table has
// listed for `retention` and that nothing holds: Hold() and Release() bracket each attempt
// and each shadow comparison on it, so one still in flight keeps its engine. An engine
// listed again (any role) is kept from then on. Before the first SetListed() every engine is
// taken as listed. A pruned engine that is recorded on again starts from zero (the
// controller's judge never counts below nothing, controller/core/canary.h).
//
// A fleet router keeps them by node as well (engine ids are a node's own): the overloads
// with `node`; those without are node "" (the router's own controller).
//
// Thread-safe (one mutex; each record is a few additions).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "base/clock.h"
#include "base/mutex.h"
#include "proto/messages.h"

namespace baton {

class EngineOutcomes {
 public:
  // The engines each node's route table lists, by node; a node left out lists none.
  using Listing = std::map<std::string, std::set<uint64_t>>;

  void RecordSucceeded(const std::string& node, uint64_t engine_id, Duration arrival_to_last_byte);
  void RecordFailed(const std::string& node, uint64_t engine_id);
  void RecordEnded(const std::string& node, uint64_t engine_id);
  void RecordComparison(const std::string& node, uint64_t canary_engine_id, bool agreed);
  void RecordSucceeded(uint64_t engine_id, Duration d) { RecordSucceeded("", engine_id, d); }
  void RecordFailed(uint64_t engine_id) { RecordFailed("", engine_id); }
  void RecordEnded(uint64_t engine_id) { RecordEnded("", engine_id); }
  void RecordComparison(uint64_t id, bool agreed) { RecordComparison("", id, agreed); }

  // Something in flight on the engine (an attempt, a shadow comparison) begins and ends; one
  // Release() per Hold(). Holding adds no counter.
  void Hold(const std::string& node, uint64_t engine_id);
  void Release(const std::string& node, uint64_t engine_id);
  // The route tables now (see above), at `now`.
  void SetListed(const Listing& listed, TimePoint now);
  // Forgets the engines unlisted for `retention` or more at `now` and not held; returns how
  // many.
  size_t Prune(TimePoint now, Duration retention);

  // Every engine of `node` kept, by engine id ascending.
  std::vector<proto::EngineOutcome> Snapshot(const std::string& node = "") const;
  // The nodes with an engine kept, by name.
  std::vector<std::string> Nodes() const;

 private:
  using Key = std::pair<std::string, uint64_t>;
  struct Engine {
    proto::EngineOutcome outcome;
    std::optional<TimePoint> unlisted_since;  // none while listed
  };
  Engine& At(const std::string& node, uint64_t engine_id) BATON_REQUIRES(mu_);
  bool Listed(const Key& key) const BATON_REQUIRES(mu_);

  mutable Mutex mu_;
  std::map<Key, Engine> engines_ BATON_GUARDED_BY(mu_);
  std::map<Key, uint64_t> held_ BATON_GUARDED_BY(mu_);   // > 0 only
  std::optional<Listing> listed_ BATON_GUARDED_BY(mu_);  // none before the first SetListed()
  TimePoint listed_at_ BATON_GUARDED_BY(mu_);            // the last SetListed()
};

}  // namespace baton
