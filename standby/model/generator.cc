#include "standby/model/generator.h"

#include <algorithm>
#include <limits>

#include "base/failpoint.h"
#include "base/log.h"

namespace baton {

Generator::Generator(LlamaModel* model, PagedKvCache* cache, GeneratorOptions options,
                     Callback callback)
    : model_(model), cache_(cache), options_(options), callback_(std::move(callback)) {
  options_.max_batch_sequences = std::max(1, options_.max_batch_sequences);
  options_.max_step_tokens = std::max(1, options_.max_step_tokens);
}

Generator::~Generator() {
  for (SeqPtr& seq : running_) ReleaseKv(&seq->kv);
  for (SeqPtr& seq : waiting_) ReleaseKv(&seq->kv);
}

void Generator::ReleaseKv(KvSequence* kv) {
  if (options_.kv_hooks != nullptr && !kv->blocks.empty()) options_.kv_hooks->Releasing(*kv);
  cache_->Release(kv);
}

Status Generator::Add(GenerationRequest request) {
  const LlamaConfig& config = model_->config();
  const std::string where = "request " + std::to_string(request.id) + ": ";
  if (request.prompt.empty()) return InvalidArgument(where + "empty prompt");
  if (static_cast<int64_t>(request.prompt.size()) >= config.max_position_embeddings) {
    return InvalidArgument(where + "prompt of " + std::to_string(request.prompt.size()) +
                           " tokens leaves no room under max_position_embeddings " +
                           std::to_string(config.max_position_embeddings));
  }
  for (int32_t id : request.prompt) {
    if (id < 0 || id >= config.vocab_size) {
      return InvalidArgument(where + "token id " + std::to_string(id) +
                             " is outside the vocabulary");
    }
  }
  if (request.max_tokens < 1) return InvalidArgument(where + "max_tokens must be at least 1");
  if (request.min_tokens < 0 || request.min_tokens > request.max_tokens) {
    return InvalidArgument(where + "min_tokens must be in [0, max_tokens]");
  }
  for (int32_t id : request.stop_token_ids) {
    if (id < 0 || id >= config.vocab_size) {
      return InvalidArgument(where + "stop token id " + std::to_string(id) +
                             " is outside the vocabulary");
    }
  }
  Status params = ValidateSamplingParams(request.sampling);
  if (!params.ok()) return InvalidArgument(where + params.message());
  auto same_id = [&](const SeqPtr& s) { return s->request.id == request.id; };
  if (std::any_of(running_.begin(), running_.end(), same_id) ||
      std::any_of(waiting_.begin(), waiting_.end(), same_id)) {
    return InvalidArgument(where + "id is already in use");
  }
  const int64_t longest =
      std::min<int64_t>(static_cast<int64_t>(request.prompt.size()) + request.max_tokens,
                        config.max_position_embeddings);
  const int64_t blocks = cache_->BlocksFor(longest);
  if (blocks > static_cast<int64_t>(cache_->total_blocks()) &&
      blocks <= static_cast<int64_t>(cache_->reachable_blocks())) {
    // It fits in the blocks this cache may hold (the pool's share of another engine, a
    // canary's, or blocks it returned): another engine may take it now.
    return Unavailable(where + "needs " + std::to_string(blocks) + " kv blocks, the cache has " +
                       std::to_string(cache_->total_blocks()) + " now");
  }
  if (blocks > static_cast<int64_t>(cache_->total_blocks())) {
    return ResourceExhausted(where + "needs " + std::to_string(blocks) +
                             " kv blocks, the cache has " + std::to_string(cache_->total_blocks()));
  }
  auto seq = std::make_unique<Sequence>();
  seq->tokens = request.prompt;
  seq->request = std::move(request);
  waiting_.push_back(std::move(seq));
  return OkStatus();
}

bool Generator::Cancel(uint64_t id) {
  auto same_id = [&](const SeqPtr& s) { return s->request.id == id; };
  if (auto it = std::find_if(waiting_.begin(), waiting_.end(), same_id); it != waiting_.end()) {
    ReleaseKv(&(*it)->kv);
    waiting_.erase(it);
    return true;
  }
  if (auto it = std::find_if(running_.begin(), running_.end(), same_id); it != running_.end()) {
    ReleaseKv(&(*it)->kv);
    running_.erase(it);
    return true;
  }
  return false;
}

std::vector<uint64_t> Generator::HandOver() {
  std::vector<uint64_t> ids;
  auto hand = [&](SeqPtr& seq, bool park) {
    if (seq->request.key.empty()) return false;
    ids.push_back(seq->request.id);
    if (park && options_.kv_hooks != nullptr && seq->kv.length > 0) {
      options_.kv_hooks->Park(seq->request, &seq->kv,
                              std::span<const int32_t>(seq->tokens).first(seq->kv.length));
    }
    ReleaseKv(&seq->kv);  // nothing left after a Park
    return true;
  };
  std::erase_if(running_, [&](SeqPtr& seq) { return hand(seq, true); });
  std::erase_if(waiting_, [&](SeqPtr& seq) { return hand(seq, false); });
  return ids;
}

void Generator::ContinueFromKept(Sequence* seq) {
  if (seq->continued || options_.kv_hooks == nullptr || seq->request.key.empty()) return;
  seq->continued = true;
  if (seq->kv.length != 0 || !seq->kv.blocks.empty()) return;
  const int64_t kept = options_.kv_hooks->Continue(seq->request, seq->tokens, &seq->kv);
  seq->kv.length = std::clamp<int64_t>(kept, 0, static_cast<int64_t>(seq->tokens.size()) - 1);
}

void Generator::Admit() {
  while (!waiting_.empty() && static_cast<int>(running_.size()) < options_.max_batch_sequences) {
    Sequence& seq = *waiting_.front();
    ContinueFromKept(&seq);
    // The sequence's whole input plus one token, and a block of headroom per running one.
    const int64_t need = cache_->BlocksFor(static_cast<int64_t>(seq.tokens.size()) + 1) -
                         static_cast<int64_t>(seq.kv.blocks.size()) +
                         static_cast<int64_t>(running_.size());
    const int64_t free = static_cast<int64_t>(cache_->free_blocks());
    if (need > free && options_.kv_hooks != nullptr) {
      options_.kv_hooks->Evict(static_cast<size_t>(need - free));
    }
    if (need > static_cast<int64_t>(cache_->free_blocks())) break;
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
}

std::vector<SequenceInput> Generator::BuildBatch(std::vector<Sequence*>* members) const {
  std::vector<SequenceInput> batch;
  members->clear();
  int64_t budget = options_.max_step_tokens;
  auto take = [&](Sequence* seq, int64_t count) {
    batch.push_back(
        {&seq->kv, std::span<const int32_t>(seq->tokens).subspan(seq->kv.length, count)});
    members->push_back(seq);
    budget -= count;
  };
  for (const SeqPtr& seq : running_) {  // decodes always go
    if (static_cast<int64_t>(seq->tokens.size()) - seq->kv.length == 1) take(seq.get(), 1);
  }
  for (const SeqPtr& seq : running_) {
    const int64_t remaining = static_cast<int64_t>(seq->tokens.size()) - seq->kv.length;
    if (remaining > 1 && budget > 0) take(seq.get(), std::min(remaining, budget));
  }
  return batch;
}

bool Generator::PreemptYoungest() {
  if (running_.size() <= 1) return false;
  SeqPtr seq = std::move(running_.back());
  running_.pop_back();
  ReleaseKv(&seq->kv);
  BATON_LOG(DEBUG, "generator") << "preempted request " << seq->request.id
                                << " for recompute (kv cache full)";
  waiting_.push_front(std::move(seq));
  return true;
}

Status Generator::RunForward(std::vector<SequenceInput>* batch, std::vector<Sequence*>* members,
                             std::vector<int64_t>* before, std::vector<float>* logits) {
  while (true) {
    before->clear();
    for (const Sequence* seq : *members) before->push_back(seq->kv.length);
    Status s = model_->Forward(cache_, *batch, logits);
    if (s.ok() || s.code() != StatusCode::kResourceExhausted || !PreemptYoungest()) return s;
    *batch = BuildBatch(members);
  }
}

FinishReason Generator::CheckFinished(const Sequence& seq, int32_t token) const {
  const LlamaConfig& config = model_->config();
  if (seq.request.stop_at_eos && config.IsEos(token)) return FinishReason::kStop;
  const std::vector<int32_t>& stops = seq.request.stop_token_ids;
  if (std::find(stops.begin(), stops.end(), token) != stops.end()) return FinishReason::kStop;
  if (seq.generated >= seq.request.max_tokens) return FinishReason::kLength;
  if (static_cast<int64_t>(seq.tokens.size()) >= config.max_position_embeddings) {
    return FinishReason::kLength;
  }
  return FinishReason::kNone;
}

void Generator::CommitKv(const std::vector<Sequence*>& members,
                         const std::vector<int64_t>& before) {
  if (options_.kv_hooks == nullptr) return;
  BATON_FAILPOINT("kv_before_commit");
  for (size_t i = 0; i < members.size(); ++i) {
    const Sequence& seq = *members[i];
    options_.kv_hooks->Committed(seq.request, seq.kv, seq.tokens, before[i]);
  }
}

void Generator::Finish(Sequence* seq) {
  ReleaseKv(&seq->kv);
  std::erase_if(running_, [&](const SeqPtr& s) { return s.get() == seq; });
}

void Generator::SampleAndEmit(const std::vector<Sequence*>& members,
                              const std::vector<float>& logits, std::vector<TokenEvent>* events) {
  const int vocab = model_->config().vocab_size;
  std::vector<Sequence*> finished;
  for (size_t i = 0; i < members.size(); ++i) {
    Sequence* seq = members[i];
    if (seq->kv.length < static_cast<int64_t>(seq->tokens.size())) continue;  // prefill chunk
    const int64_t position = static_cast<int64_t>(seq->tokens.size());
    const int32_t token = Sample(*seq, logits.data() + i * vocab, position);
    seq->tokens.push_back(token);
    ++seq->generated;
    const FinishReason finish = CheckFinished(*seq, token);
    events->push_back({seq->request.id, token, position, seq->generated, finish});
    if (finish != FinishReason::kNone) finished.push_back(seq);
  }
  for (Sequence* seq : finished) Finish(seq);
}

int32_t Generator::Sample(const Sequence& seq, const float* row, int64_t position) {
  const LlamaConfig& config = model_->config();
  const GenerationRequest& r = seq.request;
  const auto at = static_cast<uint64_t>(position);
  if (seq.generated >= r.min_tokens) return SampleToken(row, config.vocab_size, r.sampling, at);
  std::vector<float> masked(row, row + config.vocab_size);
  for (int32_t id : config.eos_token_ids) masked[id] = -std::numeric_limits<float>::infinity();
  for (int32_t id : r.stop_token_ids) masked[id] = -std::numeric_limits<float>::infinity();
  return SampleToken(masked.data(), config.vocab_size, r.sampling, at);
}

void Generator::FailAll(const std::vector<Sequence*>& members, std::vector<TokenEvent>* events) {
  for (Sequence* seq : members) {
    events->push_back({seq->request.id, -1, static_cast<int64_t>(seq->tokens.size()),
                       seq->generated, FinishReason::kError});
    Finish(seq);
  }
}

Result<int> Generator::Step() {
  Admit();
  if (running_.empty()) return 0;
  BATON_FAILPOINT("generator_step");  // ":stall": a compute that hangs, heartbeats going on
  std::vector<Sequence*> members;
  std::vector<SequenceInput> batch = BuildBatch(&members);
  std::vector<int64_t> before;
  std::vector<float> logits;
  std::vector<TokenEvent> events;
  Status status = RunForward(&batch, &members, &before, &logits);
  if (status.ok()) {
    CommitKv(members, before);
    SampleAndEmit(members, logits, &events);
  } else {
    BATON_LOG(ERROR, "generator") << "step failed: " << status.ToString();
    FailAll(members, &events);
  }
  if (callback_) {
    for (const TokenEvent& e : events) callback_(e);
  }
  if (!status.ok()) return status;
  return static_cast<int>(events.size());
}

}  // namespace baton
