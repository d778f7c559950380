// ShadowComparer: a canary judged on output agreement (docs/architecture.md, An upgrade;
// docs/router.md, Shadow comparison).
//
// Sampling in the reference engine is a pure function of (seed, position, logits), so a request
// that fixes its answer (an explicit `seed`, or `temperature` 0) must get the same token ids
// from two engines of one model. When a canary answered such a request successfully,
// RelayedRequest asks Sample() (1 of every `every` such answers; 0: none), and for a sampled one,
// once the client's answer is finished, calls Start(): the client's body goes to the current
// primary as a background "shadow" request that no client sees, with "stream": false and
// "return_token_ids": true. The primary's `choices[0].token_ids` are compared with the ids the
// canary generated, and EngineOutcomes::RecordComparison() counts the result on the canary's
// engine id; a disagreement is one INFO line naming the engine, the seed and the first
// differing position. A shadow that fails (no ready primary, connection refused or lost, a
// timeout, an answer that is not 200 with token ids) counts nothing and logs at DEBUG. At most
// kMaxInFlight shadows run at once: a shadow started at the limit is skipped, so a canary can
// never double the primary's load.
//
// Ownership: owns nothing but counters; each shadow keeps itself alive (shared_ptr) until its
// call ends. The comparer and what it points to must outlive the executor's work (the router
// stops its io_context first). Thread-safe: Sample() and Start() from any thread; each shadow
// runs on a strand of its own.
#pragma once

#include <atomic>
#include <boost/asio/any_io_executor.hpp>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "router/admitter.h"
#include "router/canary/engine_outcomes.h"
#include "router/upstream/engine_key_source.h"
#include "router/upstream/upstream_call.h"
#include "router/upstream/upstream_pool.h"

namespace baton {

// What a canary answered: the request as the client sent it and the token ids it generated.
struct CanaryAnswer {
  std::string route;  // "/v1/completions", ...
  std::string body;   // the client's request body
  uint64_t engine_id = 0;
  std::string node;  // the canary's fleet node ("" without a fleet)
  std::vector<int32_t> token_ids;
};

struct ShadowStats {
  uint64_t started = 0;  // shadows sent to the primary
  uint64_t busy = 0;     // skipped: kMaxInFlight already running
  uint64_t failed = 0;   // started or not, ended without a comparison
  uint64_t compared = 0;
  uint64_t disagreed = 0;
};

class ShadowComparer {
 public:
  static constexpr size_t kMaxInFlight = 4;

  // `every`: compare 1 of every `every` reproducible canary successes, 0 for none.
  // `admission` names the canary's primary; `outcomes` takes the comparisons (and holds the
  // canary's engine while its shadow runs); `pool` and `engine_key` (the key each shadow
  // carries) may be null.
  ShadowComparer(boost::asio::any_io_executor executor, int every, UpstreamTimeouts timeouts,
                 const Admitter* admission, EngineOutcomes* outcomes, UpstreamPool* pool,
                 const EngineKeySource* engine_key = nullptr);
  ShadowComparer(const ShadowComparer&) = delete;
  ShadowComparer& operator=(const ShadowComparer&) = delete;

  // One reproducible canary success: whether it is the one of `every` to compare.
  bool Sample();
  // Sends `answer`'s request to the primary in the background and compares (see above).
  void Start(CanaryAnswer answer);
  ShadowStats stats() const;

 private:
  class Call;  // one shadow request, defined in the .cc

  bool TakeSlot();
  // A shadow ended: `primary_ids` is what the primary generated, or why there is nothing.
  void Finish(const CanaryAnswer& answer, const Result<std::vector<int32_t>>& primary_ids);

  const boost::asio::any_io_executor executor_;
  const int every_;
  const UpstreamTimeouts timeouts_;
  const Admitter* const admission_;
  EngineOutcomes* const outcomes_;
  UpstreamPool* const pool_;
  const EngineKeySource* const engine_key_;
  std::atomic<uint64_t> sampled_{0};  // reproducible canary successes seen
  std::atomic<size_t> in_flight_{0};
  std::atomic<uint64_t> started_{0}, busy_{0}, failed_{0}, compared_{0}, disagreed_{0};
};

// The token ids of `choices[0]` of a whole completion body; nullopt unless the body has
// exactly one choice with a `token_ids` array of integers.
std::optional<std::vector<int32_t>> AnswerTokenIds(std::string_view body);

// The shadow's body: `request` (a JSON object) with "stream": false and "return_token_ids":
// true, without `stream_options` and without `baton_request_key` (a shadow carries no request
// key: it must never claim another request's KV cache); nullopt when `request` is not a JSON
// object.
std::optional<std::string> ShadowBody(std::string_view request);

// The first position where `a` and `b` differ (the shorter one's length when one is a prefix
// of the other); nullopt when they are equal.
std::optional<size_t> FirstDifference(const std::vector<int32_t>& a, const std::vector<int32_t>& b);

}  // namespace baton
