// The client side of baton-perf-failover-load: the fixed request list, the ledger of what
// became of each request, the comparison of every completed output with a reference run,
// and the summary (counts, latency percentiles in and out of the fault windows, per-fault
// detail) with its gnuplot plot.
//
// A request is `ok` (HTTP 200 with a complete answer: a JSON completion, or a stream that
// ends with [DONE] and carries no error event), `rejected` (HTTP 429: an explicit "retry
// later"), or `lost` (anything else: no answer, a broken or erroring stream, another
// status). An ok output is `duplicated` when its token ids repeat a run of the reference's
// (a replay that resent tokens) and `mismatched` when it differs from the reference in any
// other way (text or token ids); the two are disjoint.
//
// Plain values and functions; thread-compatible (each worker writes its own entries).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/status.h"
#include "perf/load/load_client.h"

namespace baton::perf {

struct LoadRequest {
  int index = 0;
  bool stream = false;
  bool chat = false;  // a /v1/chat/completions request
  double at_s = 0;    // scheduled start, seconds after the load starts
  std::string body;
  std::string path = "/v1/completions";
};

// `count` requests at `rps` a second: every other one streams, and of each kind every other
// pair is a chat completion (one user message); fixed prompts and seeds, temperature 0.8,
// max_tokens (max_completion_tokens for chat) from `min_tokens` to `max_tokens`.
std::vector<LoadRequest> MakeLoadRequests(int count, double rps, int min_tokens, int max_tokens,
                                          const std::string& model);

// The probe of a fault (failover_load_run.h): a stream of up to 384 tokens, a completion or
// a chat completion, scheduled at `at_s`; `seed` picks how long it runs before its end of
// sequence (ProbeSeeds).
LoadRequest MakeProbeRequest(int index, double at_s, uint64_t seed, const std::string& model,
                             bool chat);

enum class Outcome { kOk, kRejected, kLost };
const char* OutcomeName(Outcome o);

struct LedgerEntry {
  bool invoked = false;
  double sent_s = 0;  // when the client sent it (after at_s when all clients were busy)
  double end_s = 0;   // when the answer was complete, or the call failed
  int status = 0;
  Outcome outcome = Outcome::kLost;
  std::string reason;  // why it is lost or rejected
  CompletionOutput output;
  bool duplicated = false;
  bool mismatched = false;
};

// Fills status, outcome, reason and output from a reply.
void Classify(const LoadReply& reply, bool stream, LedgerEntry* entry);

struct Reference {
  std::string text;
  std::vector<int32_t> token_ids;
};

// True when `got` is `want` with a run of tokens sent twice (want[0..k) then want[j..],
// j < k).
bool RepeatsTokens(const std::vector<int32_t>& got, const std::vector<int32_t>& want);

// Sets duplicated / mismatched on every ok entry.
void CompareWithReference(const std::vector<Reference>& refs, std::vector<LedgerEntry>* entries);

struct Fault {
  // "kill" (SIGKILL), "hang" (SIGSTOP), "upgrade" (batonctl upgrade to the same engine with
  // another version label) or "bad_upgrade" (to one that answers every completion 500)
  std::string kind;
  double at_s = -1;               // when the signal was sent; < 0 if it was not
  int probe = -1;                 // index of its probe request
  bool stream_in_flight = false;  // the probe had sent tokens and not ended when it was sent
  int pid = 0;
  uint64_t engine_id = 0;
  std::string error;
  nlohmann::json promotion;  // the controller's timeline of the failover that followed
  nlohmann::json upgrade;    // upgrades: the controller's record of how it ended
};

// The summary JSON: ledger counts, latencies, per-fault detail. A request belongs to a
// fault's window when it was in flight or started within `window_s` after the fault;
// in_flight_at_fault counts those already sent when the fault came.
nlohmann::json Summarize(const std::vector<LoadRequest>& requests,
                         const std::vector<LedgerEntry>& entries, const std::vector<Fault>& faults,
                         double window_s);

// One line per request (JSON) in `path`.
Status WriteLedger(const std::string& path, const std::vector<LoadRequest>& requests,
                   const std::vector<LedgerEntry>& entries);

// latency.dat, failover_load.gp and failover_load.png in `dir` (gnuplot); the PNG's path.
Result<std::string> PlotLatency(const std::string& dir, const std::vector<LoadRequest>& requests,
                                const std::vector<LedgerEntry>& entries,
                                const std::vector<Fault>& faults, const std::string& title);

}  // namespace baton::perf
