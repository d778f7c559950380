// LlamaModel: a Llama-architecture decoder computed on the CPU in fp32: RMSNorm, RoPE,
// grouped-query attention over a PagedKvCache, SwiGLU MLP, and the LM head.
//
// The model reads its weights in place through a WeightTable (F32, F16 or BF16; converted
// to fp32 row by row inside the matmul); Create() checks that every tensor the config calls
// for is there with the right shape and a supported dtype. The table's memory must outlive
// the model.
//
// Forward() runs one continuous-batching step: each sequence brings its new tokens (a
// prompt or a chunk of one, or the one token being decoded) and its KvSequence; their K and
// V are written into the sequence's blocks at positions kv->length.., attention covers
// every stored position up to each token's own, and the logits of each sequence's last new
// token come back. A token's computation does not depend on what else is in the batch: the
// logits are bitwise the same whether a sequence runs alone or batched, and whether its
// prompt went in one prefill, in chunks, or token by token.
//
// Not thread-safe: one compute thread calls Forward(); the model's ComputePool splits the
// work inside a call.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "base/status.h"
#include "standby/kernels/compute_pool.h"
#include "standby/kernels/huge_buffer.h"
#include "standby/kernels/kernels.h"
#include "standby/model/llama_config.h"
#include "standby/model/paged_kv.h"
#include "standby/model/weight_table.h"

namespace baton {

struct ModelOptions {
  int threads = 1;  // ComputePool size (including the calling thread)
};

struct SequenceInput {
  KvSequence* kv = nullptr;         // grows by tokens.size(); its blocks are reserved here
  std::span<const int32_t> tokens;  // the new tokens, at absolute positions kv->length..
};

class LlamaModel {
 public:
  static Result<std::unique_ptr<LlamaModel>> Create(const LlamaConfig& config,
                                                    const WeightTable& weights,
                                                    const ModelOptions& options = {});

  const LlamaConfig& config() const { return config_; }
  // The KV block layout of this model with `block_tokens` tokens per block.
  KvLayout MakeKvLayout(int block_tokens) const;
  // The layout with as many tokens per block as fit in `block_bytes` (a pool block);
  // InvalidArgument when not even one token fits.
  Result<KvLayout> KvLayoutForBlockBytes(size_t block_bytes) const;

  // One step over `batch` (distinct sequences, each with at least one token). Blocks for
  // the new positions are reserved from `cache` for all sequences at once; when too few are
  // free, returns ResourceExhausted and changes nothing. On success `logits` holds
  // batch.size() rows of vocab_size floats and each kv->length has grown.
  Status Forward(PagedKvCache* cache, std::span<const SequenceInput> batch,
                 std::vector<float>* logits);

 private:
  struct Layer {
    Matrix attn_norm, q, k, v, o, mlp_norm, gate, up, down;
  };
  struct TokenSlot {
    KvSequence* kv;
    int64_t pos;
  };

  LlamaModel(const LlamaConfig& config, const ModelOptions& options);
  Status BindWeights(const WeightTable& weights);
  void InitRope();
  Status CheckBatch(const PagedKvCache& cache, std::span<const SequenceInput> batch) const;
  void PrepareTokens(std::span<const SequenceInput> batch);
  void Embed(std::span<const SequenceInput> batch);
  void ApplyRope(float* vec, int heads, int64_t t) const;
  void AttentionBlock(const PagedKvCache& cache, int layer_index);
  void AttendOne(const PagedKvCache& cache, int layer, int64_t t, int head, int worker);
  void MlpBlock(int layer_index);
  void NormRows(const Matrix& weight, const float* in, int64_t rows, float* out);
  void Head(std::span<const SequenceInput> batch, std::vector<float>* logits);

  LlamaConfig config_;
  ComputePool pool_;
  Matrix embed_, final_norm_, lm_head_;
  std::vector<Layer> layers_;
  std::vector<double> inv_freq_;  // RoPE frequencies, head_dim / 2

  // Per-step workspace, sized for the step's token count T.
  std::vector<TokenSlot> slots_;  // T
  // The large ones in transparent huge pages (huge_buffer.h).
  HugeVector<float> x_, h_, tmp_;           // T x hidden
  HugeVector<float> q_, attn_;              // T x q_dim
  HugeVector<float> k_, v_;                 // T x kv_dim
  HugeVector<float> gate_, up_;             // T x intermediate
  std::vector<float> cos_, sin_;            // T x head_dim / 2
  std::vector<float> norm_weight_;          // hidden
  std::vector<std::vector<float>> scores_;  // per worker, max_position_embeddings
};

}  // namespace baton
