// The trials of baton-perf-failover-long: long-context streams through baton-router to a
// controller pair of reference engines, the primary killed with kill -9 while they generate,
// and the time from the kill to each stream's next token, with the engines' KV-warm failover
// on (the new primary continues from the dead one's KV) or off (it prefills the whole context
// again, the replay as it was).
//
// A trial: the pair is ready; `requests.size()` streams start at once; when every one has
// received `cut_after` tokens the primary is killed; the streams end (the router replays them
// on the new primary); each stream's next token after the kill is the first token that
// arrives more than kInFlightMs after it (tokens the dead primary had written before its
// death reach the client within that). Outputs are compared with `reference` (undisturbed
// runs); with KV handoff on, the new primary's adoption counters say how many of the
// in-flight sequences it adopted.
//
// Thread: the driver's main thread (each trial runs one client thread per stream).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "perf/load/load_client.h"

namespace baton::perf {

inline constexpr double kInFlightMs = 2;

struct LongRequest {
  std::vector<int32_t> prompt;  // token ids
  int max_tokens = 32;
  uint64_t seed = 1;
};

// `count` requests of `context` prompt tokens each (distinct, deterministic).
std::vector<LongRequest> LongRequests(int count, int context, int max_tokens);

struct LongModeConfig {
  std::string bin_dir;
  std::string model_dir;
  std::string work_dir;  // logs of the controller, the engines and the router
  std::string served_name;
  int engine_threads = 1;
  int pool_blocks = 256;
  int block_bytes = 1 << 20;
  bool kv_handoff = true;
  int trials = 2;
  int cut_after = 8;  // tokens each stream has before the kill
};

struct LongModeResult {
  std::vector<double> next_token_ms;  // one per stream per trial
  int in_flight = 0;                  // sequences running at the kills
  int adopted = 0;                    // of them, adopted by the new primaries
  int mismatched = 0;                 // streams whose output differs from the reference
};

// Starts a pair and a router for the mode, fills `reference` with undisturbed outputs when it
// is empty (replacing the seed of a request whose answer ends before its max_tokens), and
// runs the trials.
Result<LongModeResult> RunLongMode(const LongModeConfig& config, std::vector<LongRequest>* requests,
                                   std::vector<CompletionOutput>* reference);

}  // namespace baton::perf
