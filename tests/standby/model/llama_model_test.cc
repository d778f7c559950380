#include "standby/model/llama_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <random>

#include "standby/mkmodel/model_writer.h"
#include "tests/standby/llama_testutil.h"
#include "weightcache/weight_cache.h"

namespace baton {
namespace {

// A plain Llama decoder written from the architecture's definition: one token at a time,
// double accumulation, K and V in contiguous per-layer arrays. It shares no code with the
// engine's kernels.
class ReferenceLlama {
 public:
  explicit ReferenceLlama(const TestModel& m) : m_(m), c_(m.config) {
    k_.resize(c_.num_hidden_layers);
    v_.resize(c_.num_hidden_layers);
  }

  // Appends `tokens`; returns the logits after the last one.
  std::vector<double> Run(const std::vector<int32_t>& tokens) {
    std::vector<double> logits;
    for (int32_t t : tokens) logits = Step(t);
    return logits;
  }

 private:
  using Vec = std::vector<double>;

  const std::vector<float>& W(const std::string& name) const { return m_.at(name); }

  Vec MatVec(const std::string& name, const Vec& x, int rows) const {
    const std::vector<float>& w = W(name);
    const size_t cols = x.size();
    Vec y(rows, 0.0);
    for (int r = 0; r < rows; ++r) {
      for (size_t i = 0; i < cols; ++i) y[r] += static_cast<double>(w[r * cols + i]) * x[i];
    }
    return y;
  }

  Vec Norm(const Vec& x, const std::string& name) const {
    double ss = 0;
    for (double v : x) ss += v * v;
    const double scale = 1.0 / std::sqrt(ss / x.size() + c_.rms_norm_eps);
    Vec out(x.size());
    for (size_t i = 0; i < x.size(); ++i) out[i] = x[i] * scale * W(name)[i];
    return out;
  }

  void Rope(Vec& v, int heads, int64_t pos) const {
    const int d = c_.head_dim;
    for (int h = 0; h < heads; ++h) {
      for (int i = 0; i < d / 2; ++i) {
        const double theta = pos / std::pow(c_.rope_theta, 2.0 * i / d);
        const double a = v[h * d + i], b = v[h * d + i + d / 2];
        v[h * d + i] = a * std::cos(theta) - b * std::sin(theta);
        v[h * d + i + d / 2] = b * std::cos(theta) + a * std::sin(theta);
      }
    }
  }

  Vec Attention(int layer, const Vec& q) const {
    const int d = c_.head_dim, heads = c_.num_attention_heads;
    const int64_t n = len_ + 1;
    Vec out(heads * d, 0.0);
    for (int h = 0; h < heads; ++h) {
      const int g = h / (heads / c_.num_key_value_heads);
      Vec s(n);
      double max = -1e300, sum = 0;
      for (int64_t j = 0; j < n; ++j) {
        double dot = 0;
        for (int i = 0; i < d; ++i) dot += q[h * d + i] * k_[layer][(j * c_.kv_dim()) + g * d + i];
        s[j] = dot / std::sqrt(static_cast<double>(d));
        max = std::max(max, s[j]);
      }
      for (double& x : s) sum += (x = std::exp(x - max));
      for (int64_t j = 0; j < n; ++j) {
        for (int i = 0; i < d; ++i) {
          out[h * d + i] += s[j] / sum * v_[layer][j * c_.kv_dim() + g * d + i];
        }
      }
    }
    return out;
  }

  std::vector<double> Step(int32_t token) {
    const int hidden = c_.hidden_size;
    Vec x(W("model.embed_tokens.weight").begin() + static_cast<int64_t>(token) * hidden,
          W("model.embed_tokens.weight").begin() + static_cast<int64_t>(token + 1) * hidden);
    for (int l = 0; l < c_.num_hidden_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      Vec h = Norm(x, p + "input_layernorm.weight");
      Vec q = MatVec(p + "self_attn.q_proj.weight", h, c_.q_dim());
      Vec k = MatVec(p + "self_attn.k_proj.weight", h, c_.kv_dim());
      Vec v = MatVec(p + "self_attn.v_proj.weight", h, c_.kv_dim());
      Rope(q, c_.num_attention_heads, len_);
      Rope(k, c_.num_key_value_heads, len_);
      k_[l].insert(k_[l].end(), k.begin(), k.end());
      v_[l].insert(v_[l].end(), v.begin(), v.end());
      Vec o = MatVec(p + "self_attn.o_proj.weight", Attention(l, q), hidden);
      for (int i = 0; i < hidden; ++i) x[i] += o[i];
      h = Norm(x, p + "post_attention_layernorm.weight");
      Vec g = MatVec(p + "mlp.gate_proj.weight", h, c_.intermediate_size);
      Vec u = MatVec(p + "mlp.up_proj.weight", h, c_.intermediate_size);
      for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
      Vec down = MatVec(p + "mlp.down_proj.weight", g, hidden);
      for (int i = 0; i < hidden; ++i) x[i] += down[i];
    }
    ++len_;
    return MatVec("lm_head.weight", Norm(x, "model.norm.weight"), c_.vocab_size);
  }

  const TestModel& m_;
  const LlamaConfig& c_;
  std::vector<Vec> k_, v_;  // per layer, [position][kv_dim]
  int64_t len_ = 0;
};

// KV memory for `blocks` blocks, registered in shuffled id order so that a sequence's
// blocks are scattered through the region.
struct KvArena {
  KvArena(const LlamaModel& model, int block_tokens, int blocks, uint32_t shuffle_seed) {
    Result<PagedKvCache> c = PagedKvCache::Create(model.MakeKvLayout(block_tokens));
    EXPECT_TRUE(c.ok());
    cache = std::make_unique<PagedKvCache>(std::move(*c));
    const size_t stride = cache->layout().block_bytes();
    memory.assign(stride / 4 * blocks, std::nanf(""));
    std::vector<KvBlockId> ids(blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), std::mt19937(shuffle_seed));
    for (KvBlockId id : ids) {
      EXPECT_TRUE(cache->AddBlock(id, memory.data() + id * (stride / 4), stride).ok());
    }
  }
  std::vector<float> memory;
  std::unique_ptr<PagedKvCache> cache;
};

double RelativeError(const std::vector<float>& got, const std::vector<double>& want) {
  double max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    max_diff = std::max(max_diff, std::abs(got[i] - want[i]));
    max_ref = std::max(max_ref, std::abs(want[i]));
  }
  return max_diff / max_ref;
}

std::unique_ptr<LlamaModel> MakeModel(const TestModel& m, int threads = 1) {
  Result<std::unique_ptr<LlamaModel>> model = LlamaModel::Create(m.config, m.table, {threads});
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  return model.ok() ? std::move(*model) : nullptr;
}

// Prefill then decode steps on the paged model, each compared with the reference.
void ExpectMatchesReference(const TestModel& m, int threads) {
  std::unique_ptr<LlamaModel> model = MakeModel(m, threads);
  ASSERT_NE(model, nullptr);
  KvArena kv(*model, /*block_tokens=*/3, /*blocks=*/40, /*shuffle_seed=*/5);
  ReferenceLlama ref(m);
  KvSequence seq;
  std::vector<int32_t> input = {256, 72, 101, 108, 108, 111, 44, 32, 119, 111, 114};  // 11
  std::vector<float> logits;
  for (int step = 0; step < 7; ++step) {
    const SequenceInput in{&seq, input};
    ASSERT_TRUE(model->Forward(kv.cache.get(), {&in, 1}, &logits).ok());
    const std::vector<double> want = ref.Run(input);
    ASSERT_EQ(logits.size(), want.size());
    EXPECT_LT(RelativeError(logits, want), 1e-4) << "step " << step;
    const int next = static_cast<int>(std::max_element(want.begin(), want.end()) - want.begin());
    input = {next};
  }
  EXPECT_EQ(seq.length, 17);
  EXPECT_EQ(seq.blocks.size(), 6u);
  EXPECT_FALSE(std::is_sorted(seq.blocks.begin(), seq.blocks.end()));
}

class ReferenceTest : public ::testing::TestWithParam<std::tuple<DType, bool, KernelPath>> {
 protected:
  void SetUp() override {
    if (!SetKernelPath(std::get<2>(GetParam()))) GTEST_SKIP() << "CPU lacks this kernel path";
  }
  void TearDown() override { SetKernelPath(saved_); }
  KernelPath saved_ = ActiveKernelPath();
};

TEST_P(ReferenceTest, PagedForwardMatchesPlainReference) {
  auto [dtype, misalign, path] = GetParam();
  std::unique_ptr<TestModel> m = MakeTestModel(TinySpec(dtype), misalign);
  ExpectMatchesReference(*m, /*threads=*/1);
  ExpectMatchesReference(*m, /*threads=*/3);
}

INSTANTIATE_TEST_SUITE_P(
    Dtypes, ReferenceTest,
    ::testing::Combine(::testing::Values(DType::kF32, DType::kBF16, DType::kF16), ::testing::Bool(),
                       ::testing::Values(KernelPath::kAvx2, KernelPath::kPortable)));

// Runs `prompts` through the model as one batch, then `decodes` decode steps of fixed
// tokens; returns every step's logits per sequence.
std::vector<std::vector<float>> RunBatch(LlamaModel& model, PagedKvCache& cache,
                                         const std::vector<std::vector<int32_t>>& prompts,
                                         int decodes) {
  std::vector<KvSequence> seqs(prompts.size());
  std::vector<std::vector<float>> out(prompts.size());
  std::vector<float> logits;
  const int vocab = model.config().vocab_size;
  for (int step = 0; step <= decodes; ++step) {
    std::vector<SequenceInput> batch;
    std::vector<int32_t> next(prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
      next[i] = static_cast<int32_t>((prompts[i].size() * 37 + step * 11) % 256);
      batch.push_back({&seqs[i], step == 0 ? std::span<const int32_t>(prompts[i])
                                           : std::span<const int32_t>(&next[i], 1)});
    }
    EXPECT_TRUE(model.Forward(&cache, batch, &logits).ok());
    for (size_t i = 0; i < prompts.size(); ++i) {
      out[i].insert(out[i].end(), logits.begin() + i * vocab, logits.begin() + (i + 1) * vocab);
    }
  }
  for (KvSequence& s : seqs) cache.Release(&s);
  return out;
}

TEST(LlamaModelTest, BatchedEqualsAloneBitwise) {
  std::unique_ptr<TestModel> m = MakeTestModel(TinySpec(DType::kBF16));
  std::unique_ptr<LlamaModel> batched = MakeModel(*m, /*threads=*/3);
  std::unique_ptr<LlamaModel> alone = MakeModel(*m, /*threads=*/1);
  KvArena kv(*batched, 4, 64, 9);
  const std::vector<std::vector<int32_t>> prompts = {
      {256, 1, 2, 3, 4}, {256, 9, 8, 7, 6, 5, 4, 3, 2}, {256, 200}};
  const auto together = RunBatch(*batched, *kv.cache, prompts, 5);
  EXPECT_EQ(kv.cache->free_blocks(), 64u);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(RunBatch(*alone, *kv.cache, {prompts[i]}, 5)[0], together[i]) << "sequence " << i;
  }
}

TEST(LlamaModelTest, ChunkedPrefillEqualsWholePrefillBitwise) {
  std::unique_ptr<TestModel> m = MakeTestModel(TinySpec());
  std::unique_ptr<LlamaModel> model = MakeModel(*m, 2);
  KvArena kv(*model, 5, 16, 3);
  std::vector<int32_t> prompt(23);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(i * 7 % 256);
  KvSequence whole, chunked;
  std::vector<float> a, b;
  const SequenceInput in{&whole, prompt};
  ASSERT_TRUE(model->Forward(kv.cache.get(), {&in, 1}, &a).ok());
  for (size_t at = 0; at < prompt.size(); at += 6) {
    const size_t n = std::min<size_t>(6, prompt.size() - at);
    const SequenceInput part{&chunked, std::span<const int32_t>(prompt).subspan(at, n)};
    ASSERT_TRUE(model->Forward(kv.cache.get(), {&part, 1}, &b).ok());
  }
  EXPECT_EQ(a, b);
}

TEST(LlamaModelTest, OutOfBlocksChangesNothing) {
  std::unique_ptr<TestModel> m = MakeTestModel(TinySpec());
  std::unique_ptr<LlamaModel> model = MakeModel(*m);
  KvArena kv(*model, 4, 3, 1);
  KvSequence a, b;
  std::vector<int32_t> eight(8, 65), five(5, 66);
  std::vector<float> logits;
  SequenceInput in{&a, eight};
  ASSERT_TRUE(model->Forward(kv.cache.get(), {&in, 1}, &logits).ok());
  SequenceInput batch[] = {{&a, std::span<const int32_t>(five).first(1)}, {&b, five}};
  Status s = model->Forward(kv.cache.get(), batch, &logits);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  EXPECT_EQ(a.length, 8);
  EXPECT_EQ(a.blocks.size(), 2u);
  EXPECT_TRUE(b.blocks.empty());
  EXPECT_EQ(kv.cache->free_blocks(), 1u);
}

TEST(LlamaModelTest, KvLayoutForPoolBlocks) {
  std::unique_ptr<TestModel> m = MakeTestModel(TinySpec());
  std::unique_ptr<LlamaModel> model = MakeModel(*m);
  // tiny: 2 layers x 2 kv heads x 16 dims x K and V x 4 bytes = 512 bytes per token.
  Result<KvLayout> layout = model->KvLayoutForBlockBytes(64 << 10);
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(layout->block_tokens, 128);
  EXPECT_EQ(layout->block_bytes(), 64u << 10);
  EXPECT_EQ(model->KvLayoutForBlockBytes(1000)->block_tokens, 1);
  EXPECT_FALSE(model->KvLayoutForBlockBytes(511).ok());
}

TEST(LlamaModelTest, RefusesBadInput) {
  std::unique_ptr<TestModel> m = MakeTestModel(TinySpec());
  std::unique_ptr<LlamaModel> model = MakeModel(*m);
  KvArena kv(*model, 4, 8, 1);
  KvSequence a;
  std::vector<float> logits;
  std::vector<int32_t> bad = {1, 260};
  SequenceInput in{&a, bad};
  Status s = model->Forward(kv.cache.get(), {&in, 1}, &logits);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("token id 260"), std::string::npos) << s.message();
  std::vector<int32_t> ok = {1, 2};
  SequenceInput twice[] = {{&a, ok}, {&a, ok}};
  EXPECT_EQ(model->Forward(kv.cache.get(), twice, &logits).code(), StatusCode::kInvalidArgument);
  std::vector<int32_t> too_long(m->config.max_position_embeddings + 1, 5);
  KvArena big(*model, 64, 16, 1);
  SequenceInput longer{&a, too_long};
  s = model->Forward(big.cache.get(), {&longer, 1}, &logits);
  EXPECT_NE(s.message().find("max_position_embeddings"), std::string::npos) << s.message();
  Result<PagedKvCache> other = PagedKvCache::Create({1, 2, 16, 4});
  ASSERT_TRUE(other.ok());
  SequenceInput fine{&a, ok};
  EXPECT_EQ(model->Forward(&*other, {&fine, 1}, &logits).code(), StatusCode::kInvalidArgument);
}

// Rebuilds the tiny model's table with `name` changed by `edit` (or left out when null).
Status CreateWith(const TestModel& m, const std::string& name, void (*edit)(TensorView*)) {
  WeightTable table;
  for (auto [n, view] : m.views) {
    if (n == name) {
      if (edit == nullptr) continue;
      edit(&view);
    }
    EXPECT_TRUE(table.Add(n, view).ok());
  }
  return LlamaModel::Create(m.config, table).status();
}

TEST(LlamaModelTest, CreateValidatesWeights) {
  std::unique_ptr<TestModel> m = MakeTestModel(TinySpec());
  const std::string q = "model.layers.1.self_attn.q_proj.weight";
  Status s = CreateWith(*m, q, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find(q), std::string::npos) << s.message();
  s = CreateWith(*m, q, [](TensorView* v) { v->shape = {32, 64}; });
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("[32, 64]"), std::string::npos) << s.message();
  s = CreateWith(*m, q, [](TensorView* v) { v->dtype = DType::kI8; });
  EXPECT_NE(s.message().find("I8"), std::string::npos) << s.message();
  // Tied embeddings may leave lm_head out.
  EXPECT_FALSE(CreateWith(*m, "lm_head.weight", nullptr).ok());
  m->config.tie_word_embeddings = true;
  EXPECT_TRUE(CreateWith(*m, "lm_head.weight", nullptr).ok());
}

TEST(LlamaModelTest, RunsFromWrittenModelInWeightCache) {
  const std::string dir = testing::TempDir() + "/llama_model_test_model";
  std::filesystem::remove_all(dir);
  ModelSpec spec = TinySpec(DType::kBF16);
  ASSERT_TRUE(WriteModel(spec, dir).ok());
  WeightCacheOptions options;
  options.arena.huge_pages = false;
  options.arena.lock = false;
  Result<WeightCache> cache = WeightCache::Load(dir, options);
  ASSERT_TRUE(cache.ok()) << cache.status().ToString();
  Result<WeightTable> table = WeightTable::FromCache(*cache);
  ASSERT_TRUE(table.ok()) << table.status().ToString();
  Result<LlamaConfig> config = LoadLlamaConfig(dir);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  Result<std::unique_ptr<LlamaModel>> from_cache = LlamaModel::Create(*config, *table);
  ASSERT_TRUE(from_cache.ok()) << from_cache.status().ToString();
  std::unique_ptr<TestModel> m = MakeTestModel(spec);
  std::unique_ptr<LlamaModel> in_memory = MakeModel(*m);
  KvArena kv(*in_memory, 8, 8, 2);
  const std::vector<std::vector<int32_t>> prompt = {{256, 10, 20, 30}};
  EXPECT_EQ(RunBatch(**from_cache, *kv.cache, prompt, 3),
            RunBatch(*in_memory, *kv.cache, prompt, 3));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace baton
