// The two kinds of trial of baton-perf-failover.
//
// BatonPair: one baton-controller running a primary and a standby reference engine on a
// model, in its own runtime directory. Trial() kills the primary with SIGKILL (kill(2)
// from this process), probes the standby's HTTP address until /health answers 200 (the
// promoted engine accepts requests), sends a max_tokens=1 completion until its answer (the
// first token), and reads the controller's timeline of that failover; the next trial waits
// until the pair is ready again with a new standby.
//
// ColdTrial(): starts a standalone baton-refengine that loads its own weights with plain
// reads, as a typical engine does, and times exec -> listening -> first token of a
// max_tokens=1 completion, with the model's files in the page cache or evicted first.
//
// Ownership: a BatonPair owns its controller process (its engines die with it). Thread: the
// driver's one thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "perf/pair/failover_procs.h"

namespace baton::perf {

struct ModelInfo {
  std::string dir;
  std::vector<std::string> files;  // the safetensors shards
  uint64_t file_bytes = 0;
  uint64_t kv_bytes_per_token = 0;  // layers x K,V x kv_heads x head_dim x float
};
Result<ModelInfo> DescribeModel(const std::string& dir);

struct PairOptions {
  std::string bin_dir;   // baton-controller, batonctl, baton-refengine
  std::string work_dir;  // runtime directory of the controller, and logs
  int engine_threads = 1;
  int pool_blocks = 64;
  int prompt_tokens = 1;   // the first-token request's prompt length (FirstTokenRequest)
  int epoch_reserve = 64;  // the controller's controller.epoch_reserve
  // The engine program, run with the reference engine's flags (--model, --port, --controller,
  // --threads, --kv-blocks, ...); empty: bin_dir/baton-refengine.
  std::string engine = {};
};

// opts.engine, or the reference engine of opts.bin_dir.
std::string EngineProgram(const PairOptions& opts);

struct FailoverSample {
  double ready_ms = 0;              // kill -> the promoted standby's /health answers 200
  double first_token_ms = 0;        // kill -> the answer of a max_tokens=1 completion
  std::optional<double> detect_ms;  // kill -> the controller's "fenced" log line
  double fence_ms = 0, promote_ms = 0, controller_ready_ms = 0;  // the controller's timeline
  // The controller's timeline: detected -> the old primary's barrier passed (its blocks out
  // of quarantine); whether the promotion started before it, on the promotion reserve.
  double teardown_ms = 0;
  bool before_barrier = false;
  int probes = 0;              // /health requests sent until 200
  double next_request_ms = 0;  // the same request again on the new primary: a forward pass
  double before_kill_ms = 0;   // the same request on the primary before the kill (idle before)
};

// The request of every first-token measurement: greedy, max_tokens=1, a prompt of
// `prompt_tokens` token ids (the bytes of a fixed sentence, repeated as needed). One token
// makes it one decode step, the shortest forward pass; longer prompts add prefill, which
// costs the same after a cold restart as after a promotion.
std::string FirstTokenRequest(int prompt_tokens);

class BatonPair {
 public:
  static Result<std::unique_ptr<BatonPair>> Start(const ModelInfo& model, const PairOptions& opts);
  ~BatonPair();

  Result<FailoverSample> Trial();
  // Client-side latency of FirstTokenRequest(prompt_tokens) on the serving primary (one forward
  // pass).
  Result<double> ForwardPassMs();
  uint64_t block_bytes() const { return block_bytes_; }
  int block_tokens() const { return block_tokens_; }
  bool huge_pages() const { return huge_pages_; }
  // Stops the controller (SIGTERM); its exit status.
  int Stop();

 private:
  struct Engines {
    pid_t primary_pid = 0;
    std::string primary_address, standby_address;
  };
  BatonPair(const ModelInfo& model, const PairOptions& opts) : model_(model), opts_(opts) {}
  Status WriteConfig();
  Result<Engines> WaitReady(std::chrono::seconds limit);
  Result<nlohmann::json> TimelineOf(pid_t old_pid);

  ModelInfo model_;
  PairOptions opts_;
  std::string socket_, log_;
  uint64_t block_bytes_ = 0;
  int block_tokens_ = 0;
  bool huge_pages_ = false;
  std::optional<ChildProcess> controller_;
};

struct ColdSample {
  double listening_ms = 0;     // exec -> the port file is written (weights loaded, serving)
  double first_token_ms = 0;   // exec -> the answer of a max_tokens=1 completion
  double resident_before = 0;  // fraction of the model's pages in the page cache at exec
};

// `kv_tokens` sizes the engine's KV cache like the pair's pool.
Result<ColdSample> ColdTrial(const ModelInfo& model, const PairOptions& opts, bool evict,
                             int kv_tokens, int index);

}  // namespace baton::perf
