// Generator: continuous batching of generation requests over one LlamaModel and one
// PagedKvCache.
//
// Add() queues a request (prompt ids, max_tokens, sampling, stop ids, min_tokens). Each Step()
// first admits waiting requests while the cache has room, then runs one Forward over every
// running sequence: one token for each sequence that is decoding, and chunks of prompts
// for those still in prefill (decodes first, then prefill, within max_step_tokens). Each
// sequence whose input is complete gets its next token sampled at its absolute position
// (SampleToken keyed by (seed, position)) and emitted through the callback; a sequence
// that stops (eos, a stop id, max_tokens, or max_position_embeddings) releases its
// blocks. When the cache cannot hold the step, the most recently admitted sequence is
// preempted: its blocks are released and it goes back to the head of the queue to be
// recomputed from prompt + generated tokens, which yields the same tokens because every
// token's computation and sampling depend only on the tokens before it and the seed.
//
// With KvHooks (GeneratorOptions::kv_hooks) the engine keeps each sequence's KV for a
// successor: the hooks see every step's new K and V (Committed, after the forward and before
// sampling), every release of a sequence's blocks (Releasing, before the blocks are free),
// and a request with a key may be admitted with blocks that already hold the K and V of its
// first tokens (Continue): only the rest is prefilled. HandOver() stops every keyed request
// and gives the running sequences' blocks to the hooks (Park) instead of freeing them.
//
// Thread model: one compute thread owns the Generator and calls Add, Cancel and Step.
// Callbacks run on that thread after the step's state is settled; they may call Add or
// Cancel. The model and the cache must outlive the Generator, which releases every block it
// holds when destroyed.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "base/status.h"
#include "standby/model/kv_hooks.h"
#include "standby/model/llama_model.h"
#include "standby/model/paged_kv.h"
#include "standby/model/sampler.h"

namespace baton {

struct GenerationRequest {
  uint64_t id = 0;              // unique among the Generator's live requests
  std::vector<int32_t> prompt;  // at least one id, shorter than max_position_embeddings
  int max_tokens = 16;          // at least 1
  SamplingParams sampling;
  bool stop_at_eos = true;  // eos is emitted, then the request finishes
  // Ids that, like eos, are emitted and finish the request (vLLM's stop_token_ids).
  std::vector<int32_t> stop_token_ids;
  // Until this many tokens are generated, eos (stop_at_eos or not, as in vLLM) and the stop
  // ids get no probability (vLLM's min_tokens); in [0, max_tokens].
  int min_tokens = 0;
  KvRequestKey key;  // the router's key (empty: none); see KvHooks::Continue
};

enum class FinishReason { kNone, kLength, kStop, kError };

struct TokenEvent {
  uint64_t request_id = 0;
  int32_t token = -1;    // -1 on an error event (no token)
  int64_t position = 0;  // the token's absolute position in the sequence
  int generated = 0;     // tokens produced for the request so far, this one included
  FinishReason finish = FinishReason::kNone;
};

struct GeneratorOptions {
  int max_batch_sequences = 64;  // running sequences at once
  int max_step_tokens = 512;     // tokens per Forward (prefill is cut in chunks to fit)
  KvHooks* kv_hooks = nullptr;   // optional; must outlive the Generator
};

class Generator {
 public:
  using Callback = std::function<void(const TokenEvent&)>;

  Generator(LlamaModel* model, PagedKvCache* cache, GeneratorOptions options, Callback callback);
  ~Generator();
  Generator(const Generator&) = delete;
  Generator& operator=(const Generator&) = delete;

  // Queues a request. Refuses bad ids, parameters or a duplicate id (InvalidArgument), and
  // a request that could not fit in the whole cache (ResourceExhausted), or not in the cache
  // as it is now but in PagedKvCache::reachable_blocks() (Unavailable: try another engine).
  Status Add(GenerationRequest request);
  // Drops a waiting or running request without an event; false when unknown.
  bool Cancel(uint64_t id);
  // Drops every request that has a key, without an event: the running ones go to
  // KvHooks::Park (their blocks kept), the waiting ones are freed. Requests without a key
  // stay. Returns the ids dropped.
  std::vector<uint64_t> HandOver();
  // One batched forward step; returns the number of events emitted (0 when idle). A model
  // error fails the step's sequences with kError events and is returned.
  Result<int> Step();

  bool idle() const { return running_.empty() && waiting_.empty(); }
  size_t running() const { return running_.size(); }
  size_t waiting() const { return waiting_.size(); }

 private:
  struct Sequence {
    GenerationRequest request;
    std::vector<int32_t> tokens;  // prompt, then generated tokens
    int generated = 0;
    KvSequence kv;
    bool continued = false;  // KvHooks::Continue was asked
  };
  using SeqPtr = std::unique_ptr<Sequence>;

  void Admit();
  // Gives a waiting sequence the kept KV of its first tokens, once.
  void ContinueFromKept(Sequence* seq);
  std::vector<SequenceInput> BuildBatch(std::vector<Sequence*>* members) const;
  // Runs the step; `before` gets each member's kv length before it.
  Status RunForward(std::vector<SequenceInput>* batch, std::vector<Sequence*>* members,
                    std::vector<int64_t>* before, std::vector<float>* logits);
  void CommitKv(const std::vector<Sequence*>& members, const std::vector<int64_t>& before);
  void ReleaseKv(KvSequence* kv);
  bool PreemptYoungest();
  void SampleAndEmit(const std::vector<Sequence*>& members, const std::vector<float>& logits,
                     std::vector<TokenEvent>* events);
  FinishReason CheckFinished(const Sequence& seq, int32_t token) const;
  // The token chosen for `seq` from its row of logits, with its stop ids masked while it is
  // under min_tokens.
  int32_t Sample(const Sequence& seq, const float* row, int64_t position);
  void Finish(Sequence* seq);
  void FailAll(const std::vector<Sequence*>& members, std::vector<TokenEvent>* events);

  LlamaModel* model_;
  PagedKvCache* cache_;
  GeneratorOptions options_;
  Callback callback_;
  std::deque<SeqPtr> waiting_;
  std::vector<SeqPtr> running_;  // in admission order
};

}  // namespace baton
