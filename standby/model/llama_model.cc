#include "standby/model/llama_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>
#include <string>

namespace baton {
namespace {

constexpr int64_t kMaxStepTokens = 1 << 20;

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

// The tensor `name` as a Matrix of the expected shape ([n] for a vector, [rows, cols]).
Result<Matrix> Expect(const WeightTable& weights, const std::string& name,
                      std::vector<int64_t> shape) {
  const TensorView* t = weights.Find(name);
  if (t == nullptr) return NotFound("model weights: tensor '" + name + "' is missing");
  if (t->dtype != DType::kF32 && t->dtype != DType::kF16 && t->dtype != DType::kBF16) {
    return InvalidArgument("model weights: tensor '" + name + "' has dtype " +
                           std::string(DTypeName(t->dtype)) + " (supported: F32, F16, BF16)");
  }
  if (t->shape != shape) {
    return InvalidArgument("model weights: tensor '" + name + "' has shape " + ShapeText(t->shape) +
                           " but the config needs " + ShapeText(shape));
  }
  Matrix m;
  m.dtype = t->dtype;
  m.rows = shape.size() == 1 ? 1 : shape[0];
  m.cols = shape.back();
  m.data = t->data;
  return m;
}

void AddInto(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

}  // namespace

LlamaModel::LlamaModel(const LlamaConfig& config, const ModelOptions& options)
    : config_(config), pool_(options.threads) {}

Result<std::unique_ptr<LlamaModel>> LlamaModel::Create(const LlamaConfig& config,
                                                       const WeightTable& weights,
                                                       const ModelOptions& options) {
  BATON_RETURN_IF_ERROR(config.Validate());
  std::unique_ptr<LlamaModel> model(new LlamaModel(config, options));
  BATON_RETURN_IF_ERROR(model->BindWeights(weights));
  model->InitRope();
  model->scores_.assign(model->pool_.threads(), std::vector<float>(config.max_position_embeddings));
  return model;
}

Status LlamaModel::BindWeights(const WeightTable& w) {
  const int64_t hidden = config_.hidden_size, inter = config_.intermediate_size;
  const int64_t vocab = config_.vocab_size;
  BATON_ASSIGN_OR_RETURN(embed_, Expect(w, "model.embed_tokens.weight", {vocab, hidden}));
  BATON_ASSIGN_OR_RETURN(final_norm_, Expect(w, "model.norm.weight", {hidden}));
  if (config_.tie_word_embeddings && w.Find("lm_head.weight") == nullptr) {
    lm_head_ = embed_;
  } else {
    BATON_ASSIGN_OR_RETURN(lm_head_, Expect(w, "lm_head.weight", {vocab, hidden}));
  }
  layers_.resize(config_.num_hidden_layers);
  for (int i = 0; i < config_.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    Layer& l = layers_[i];
    BATON_ASSIGN_OR_RETURN(l.attn_norm, Expect(w, p + "input_layernorm.weight", {hidden}));
    BATON_ASSIGN_OR_RETURN(l.q,
                           Expect(w, p + "self_attn.q_proj.weight", {config_.q_dim(), hidden}));
    BATON_ASSIGN_OR_RETURN(l.k,
                           Expect(w, p + "self_attn.k_proj.weight", {config_.kv_dim(), hidden}));
    BATON_ASSIGN_OR_RETURN(l.v,
                           Expect(w, p + "self_attn.v_proj.weight", {config_.kv_dim(), hidden}));
    BATON_ASSIGN_OR_RETURN(l.o,
                           Expect(w, p + "self_attn.o_proj.weight", {hidden, config_.q_dim()}));
    BATON_ASSIGN_OR_RETURN(l.mlp_norm, Expect(w, p + "post_attention_layernorm.weight", {hidden}));
    BATON_ASSIGN_OR_RETURN(l.gate, Expect(w, p + "mlp.gate_proj.weight", {inter, hidden}));
    BATON_ASSIGN_OR_RETURN(l.up, Expect(w, p + "mlp.up_proj.weight", {inter, hidden}));
    BATON_ASSIGN_OR_RETURN(l.down, Expect(w, p + "mlp.down_proj.weight", {hidden, inter}));
  }
  return OkStatus();
}

void LlamaModel::InitRope() {
  const int half = config_.head_dim / 2;
  const RopeScaling& rs = config_.rope_scaling;
  inv_freq_.resize(half);
  for (int i = 0; i < half; ++i) {
    double f = std::pow(config_.rope_theta, -2.0 * i / config_.head_dim);
    if (rs.type == RopeScaling::Type::kLinear) f /= rs.factor;
    if (rs.type == RopeScaling::Type::kLlama3) {
      const double wavelen = 2 * std::numbers::pi / f;
      const double old_len = rs.original_max_position_embeddings;
      if (wavelen > old_len / rs.low_freq_factor) {
        f /= rs.factor;
      } else if (wavelen >= old_len / rs.high_freq_factor) {
        const double smooth =
            (old_len / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
        f = (1 - smooth) * f / rs.factor + smooth * f;
      }
    }
    inv_freq_[i] = f;
  }
}

KvLayout LlamaModel::MakeKvLayout(int block_tokens) const {
  return {config_.num_hidden_layers, config_.num_key_value_heads, config_.head_dim, block_tokens};
}

Result<KvLayout> LlamaModel::KvLayoutForBlockBytes(size_t block_bytes) const {
  const size_t per_token = MakeKvLayout(1).block_bytes();
  const size_t tokens = std::min<size_t>(block_bytes / per_token, 1 << 20);
  if (tokens == 0) {
    return InvalidArgument("kv block of " + std::to_string(block_bytes) +
                           " bytes holds no token; one token needs " + std::to_string(per_token));
  }
  return MakeKvLayout(static_cast<int>(tokens));
}

Status LlamaModel::CheckBatch(const PagedKvCache& cache,
                              std::span<const SequenceInput> batch) const {
  const KvLayout& l = cache.layout();
  if (l.layers != config_.num_hidden_layers || l.kv_heads != config_.num_key_value_heads ||
      l.head_dim != config_.head_dim) {
    return InvalidArgument("forward: the kv cache's layout does not match the model");
  }
  int64_t total = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const SequenceInput& in = batch[i];
    const std::string where = "forward: sequence " + std::to_string(i) + ": ";
    if (in.kv == nullptr || in.tokens.empty()) return InvalidArgument(where + "no kv or no tokens");
    for (size_t j = 0; j < i; ++j) {
      if (batch[j].kv == in.kv) return InvalidArgument(where + "appears twice in the batch");
    }
    if (in.kv->length < 0 ||
        static_cast<int64_t>(in.kv->blocks.size()) < cache.BlocksFor(in.kv->length)) {
      return InvalidArgument(where + "its block table does not hold its length");
    }
    if (in.kv->length + static_cast<int64_t>(in.tokens.size()) > config_.max_position_embeddings) {
      return InvalidArgument(where + "would pass max_position_embeddings " +
                             std::to_string(config_.max_position_embeddings));
    }
    for (int32_t id : in.tokens) {
      if (id < 0 || id >= config_.vocab_size) {
        return InvalidArgument(where + "token id " + std::to_string(id) +
                               " is outside the vocabulary of " +
                               std::to_string(config_.vocab_size));
      }
    }
    total += static_cast<int64_t>(in.tokens.size());
  }
  if (total > kMaxStepTokens) return InvalidArgument("forward: too many tokens in one step");
  return OkStatus();
}

Status LlamaModel::Forward(PagedKvCache* cache, std::span<const SequenceInput> batch,
                           std::vector<float>* logits) {
  logits->clear();
  if (batch.empty()) return OkStatus();
  BATON_RETURN_IF_ERROR(CheckBatch(*cache, batch));
  std::vector<KvSequence*> seqs;
  std::vector<int64_t> lengths;
  for (const SequenceInput& in : batch) {
    seqs.push_back(in.kv);
    lengths.push_back(in.kv->length + static_cast<int64_t>(in.tokens.size()));
  }
  BATON_RETURN_IF_ERROR(cache->Reserve(seqs, lengths));
  PrepareTokens(batch);
  Embed(batch);
  for (int l = 0; l < config_.num_hidden_layers; ++l) {
    AttentionBlock(*cache, l);
    MlpBlock(l);
  }
  Head(batch, logits);
  for (size_t i = 0; i < batch.size(); ++i) batch[i].kv->length = lengths[i];
  return OkStatus();
}

void LlamaModel::PrepareTokens(std::span<const SequenceInput> batch) {
  slots_.clear();
  for (const SequenceInput& in : batch) {
    for (size_t j = 0; j < in.tokens.size(); ++j) {
      slots_.push_back({in.kv, in.kv->length + static_cast<int64_t>(j)});
    }
  }
  const size_t t = slots_.size();
  const int half = config_.head_dim / 2;
  x_.resize(t * config_.hidden_size);
  h_.resize(t * config_.hidden_size);
  tmp_.resize(t * config_.hidden_size);
  q_.resize(t * config_.q_dim());
  attn_.resize(t * config_.q_dim());
  k_.resize(t * config_.kv_dim());
  v_.resize(t * config_.kv_dim());
  gate_.resize(t * config_.intermediate_size);
  up_.resize(t * config_.intermediate_size);
  cos_.resize(t * half);
  sin_.resize(t * half);
  norm_weight_.resize(config_.hidden_size);
  for (size_t i = 0; i < t; ++i) {
    for (int f = 0; f < half; ++f) {
      const double angle = static_cast<double>(slots_[i].pos) * inv_freq_[f];
      cos_[i * half + f] = static_cast<float>(std::cos(angle));
      sin_[i * half + f] = static_cast<float>(std::sin(angle));
    }
  }
}

void LlamaModel::Embed(std::span<const SequenceInput> batch) {
  const int64_t hidden = config_.hidden_size;
  float* out = x_.data();
  for (const SequenceInput& in : batch) {
    for (int32_t id : in.tokens) {
      const float* row = MatrixRow(embed_, id, out);
      if (row != out) std::memcpy(out, row, hidden * sizeof(float));
      out += hidden;
    }
  }
}

void LlamaModel::NormRows(const Matrix& weight, const float* in, int64_t rows, float* out) {
  const int64_t n = config_.hidden_size;
  const float* w = MatrixRow(weight, 0, norm_weight_.data());
  const float eps = static_cast<float>(config_.rms_norm_eps);
  for (int64_t r = 0; r < rows; ++r) RmsNorm(in + r * n, w, n, eps, out + r * n);
}

void LlamaModel::ApplyRope(float* vec, int heads, int64_t t) const {
  const int hd = config_.head_dim, half = hd / 2;
  const float* c = cos_.data() + t * half;
  const float* s = sin_.data() + t * half;
  for (int h = 0; h < heads; ++h) {
    float* v = vec + h * hd;
    for (int i = 0; i < half; ++i) {
      const float x0 = v[i], x1 = v[i + half];
      v[i] = x0 * c[i] - x1 * s[i];
      v[i + half] = x1 * c[i] + x0 * s[i];
    }
  }
}

void LlamaModel::AttentionBlock(const PagedKvCache& cache, int layer_index) {
  const Layer& layer = layers_[layer_index];
  const int64_t t_count = static_cast<int64_t>(slots_.size());
  const int hd = config_.head_dim, kvh = config_.num_key_value_heads;
  NormRows(layer.attn_norm, x_.data(), t_count, h_.data());
  MatMul(layer.q, h_.data(), t_count, q_.data(), &pool_);
  MatMul(layer.k, h_.data(), t_count, k_.data(), &pool_);
  MatMul(layer.v, h_.data(), t_count, v_.data(), &pool_);
  for (int64_t t = 0; t < t_count; ++t) {
    ApplyRope(q_.data() + t * config_.q_dim(), config_.num_attention_heads, t);
    ApplyRope(k_.data() + t * config_.kv_dim(), kvh, t);
    for (int g = 0; g < kvh; ++g) {
      const size_t off = t * config_.kv_dim() + g * hd;
      std::memcpy(cache.Row(*slots_[t].kv, layer_index, 0, g, slots_[t].pos), &k_[off], hd * 4);
      std::memcpy(cache.Row(*slots_[t].kv, layer_index, 1, g, slots_[t].pos), &v_[off], hd * 4);
    }
  }
  const int heads = config_.num_attention_heads;
  int64_t longest = 1;
  for (const TokenSlot& s : slots_) longest = std::max(longest, s.pos + 1);
  const int64_t min_chunk = std::max<int64_t>(1, (32 << 10) / (longest * hd));
  pool_.ParallelFor(t_count * heads, min_chunk, [&](int64_t begin, int64_t end, int worker) {
    for (int64_t i = begin; i < end; ++i) {
      AttendOne(cache, layer_index, i / heads, static_cast<int>(i % heads), worker);
    }
  });
  MatMul(layer.o, attn_.data(), t_count, tmp_.data(), &pool_);
  AddInto(x_.data(), tmp_.data(), t_count * config_.hidden_size);
}

void LlamaModel::AttendOne(const PagedKvCache& cache, int layer, int64_t t, int head, int worker) {
  const int hd = config_.head_dim;
  const int group = head / config_.group_size();
  const int bt = cache.layout().block_tokens;
  const TokenSlot& slot = slots_[t];
  const float* q = q_.data() + t * config_.q_dim() + head * hd;
  float* out = attn_.data() + t * config_.q_dim() + head * hd;
  float* scores = scores_[worker].data();
  const int64_t n = slot.pos + 1;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const size_t k_off = cache.layout().RowOffset(layer, 0, group, 0);
  const size_t v_off = cache.layout().RowOffset(layer, 1, group, 0);
  float max_score = -std::numeric_limits<float>::infinity();
  for (int64_t j0 = 0; j0 < n; j0 += bt) {
    const float* k = cache.BlockData(slot.kv->blocks[j0 / bt]) + k_off;
    const int64_t m = std::min<int64_t>(bt, n - j0);
    for (int64_t j = 0; j < m; ++j) {
      scores[j0 + j] = Dot(q, k + j * hd, hd) * scale;
      max_score = std::max(max_score, scores[j0 + j]);
    }
  }
  float sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    scores[j] = std::exp(scores[j] - max_score);
    sum += scores[j];
  }
  const float inv_sum = 1.0f / sum;
  std::fill(out, out + hd, 0.0f);
  for (int64_t j0 = 0; j0 < n; j0 += bt) {
    const float* v = cache.BlockData(slot.kv->blocks[j0 / bt]) + v_off;
    const int64_t m = std::min<int64_t>(bt, n - j0);
    for (int64_t j = 0; j < m; ++j) Axpy(scores[j0 + j] * inv_sum, v + j * hd, out, hd);
  }
}

void LlamaModel::MlpBlock(int layer_index) {
  const Layer& layer = layers_[layer_index];
  const int64_t t_count = static_cast<int64_t>(slots_.size());
  NormRows(layer.mlp_norm, x_.data(), t_count, h_.data());
  MatMul(layer.gate, h_.data(), t_count, gate_.data(), &pool_);
  MatMul(layer.up, h_.data(), t_count, up_.data(), &pool_);
  SiluMul(gate_.data(), up_.data(), t_count * config_.intermediate_size);
  MatMul(layer.down, gate_.data(), t_count, tmp_.data(), &pool_);
  AddInto(x_.data(), tmp_.data(), t_count * config_.hidden_size);
}

void LlamaModel::Head(std::span<const SequenceInput> batch, std::vector<float>* logits) {
  const int64_t hidden = config_.hidden_size;
  int64_t last = -1;
  for (size_t i = 0; i < batch.size(); ++i) {
    last += static_cast<int64_t>(batch[i].tokens.size());
    std::memcpy(tmp_.data() + i * hidden, x_.data() + last * hidden, hidden * sizeof(float));
  }
  const int64_t rows = static_cast<int64_t>(batch.size());
  NormRows(final_norm_, tmp_.data(), rows, h_.data());
  logits->resize(static_cast<size_t>(rows) * config_.vocab_size);
  MatMul(lm_head_, h_.data(), rows, logits->data(), &pool_);
}

}  // namespace baton
