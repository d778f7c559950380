#include "standby/model/generator.h"

#include <gtest/gtest.h>

#include <map>

#include "tests/standby/llama_testutil.h"

namespace baton {
namespace {

struct Outputs {
  std::map<uint64_t, std::vector<int32_t>> tokens;
  std::map<uint64_t, std::vector<int64_t>> positions;
  std::map<uint64_t, FinishReason> finish;
};

// A model, a cache of `blocks` blocks of `block_tokens`, and a Generator recording events.
class Harness {
 public:
  Harness(const TestModel& m, int blocks, int block_tokens = 4, GeneratorOptions options = {}) {
    model_ = LlamaModel::Create(m.config, m.table, {2}).value();
    cache_ = std::make_unique<PagedKvCache>(
        PagedKvCache::Create(model_->MakeKvLayout(block_tokens)).value());
    memory_.resize(cache_->layout().block_bytes() / 4 * blocks);
    EXPECT_TRUE(cache_->AddRegion(0, memory_.data(), cache_->layout().block_bytes(), blocks).ok());
    gen_ = std::make_unique<Generator>(model_.get(), cache_.get(), options,
                                       [this](const TokenEvent& e) { Record(e); });
  }

  void Record(const TokenEvent& e) {
    if (e.token >= 0) {
      out.tokens[e.request_id].push_back(e.token);
      out.positions[e.request_id].push_back(e.position);
    }
    if (e.finish != FinishReason::kNone) out.finish[e.request_id] = e.finish;
  }

  void RunToIdle() {
    for (int i = 0; i < 10000 && !gen_->idle(); ++i) ASSERT_TRUE(gen_->Step().ok());
    ASSERT_TRUE(gen_->idle());
    EXPECT_EQ(cache_->free_blocks(), cache_->total_blocks());
  }

  Generator& gen() { return *gen_; }
  PagedKvCache& cache() { return *cache_; }
  Outputs out;

 private:
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<PagedKvCache> cache_;
  std::vector<float> memory_;
  std::unique_ptr<Generator> gen_;
};

GenerationRequest Request(uint64_t id, std::vector<int32_t> prompt, int max_tokens,
                          uint64_t seed = 1234) {
  GenerationRequest r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling = {0.9f, 0.95f, seed};
  r.stop_at_eos = false;
  return r;
}

const std::vector<int32_t> kPrompt = {256, 84, 104, 101, 32, 113, 117, 105, 99, 107};

// Request 1: kPrompt, 8 tokens, greedy, no stop at eos.
GenerationRequest Greedy() {
  GenerationRequest r = Request(1, kPrompt, 8);
  r.sampling = {0.0f, 1.0f, 0};
  return r;
}

// The tokens `request` (id 1) gets alone on `m`.
std::vector<int32_t> GreedyTokens(const TestModel& m, const GenerationRequest& request) {
  Harness plain(m, 64);
  EXPECT_TRUE(plain.gen().Add(request).ok());
  plain.RunToIdle();
  return plain.out.tokens[1];
}

TEST(GeneratorTest, ReplayContinuesByteIdentically) {
  std::unique_ptr<TestModel> m = MakeTestModel(TinySpec(DType::kBF16));
  constexpr int kN = 24;
  Harness first(*m, 64);
  ASSERT_TRUE(first.gen().Add(Request(1, kPrompt, kN)).ok());
  first.RunToIdle();
  const std::vector<int32_t> full = first.out.tokens[1];
  ASSERT_EQ(full.size(), static_cast<size_t>(kN));
  EXPECT_EQ(first.out.positions[1].front(), static_cast<int64_t>(kPrompt.size()));
  EXPECT_EQ(first.out.finish[1], FinishReason::kLength);
  std::set<int32_t> distinct(full.begin(), full.end());
  EXPECT_GT(distinct.size(), 3u);  // really sampled, not a fixed point

  for (int k : {1, 5, 13, 23}) {
    Harness replay(*m, 64);
    std::vector<int32_t> prompt = kPrompt;
    prompt.insert(prompt.end(), full.begin(), full.begin() + k);
    // Unrelated traffic in the same batches must not change anything.
    ASSERT_TRUE(replay.gen().Add(Request(7, {256, 1, 2, 3}, 9, 99)).ok());
    ASSERT_TRUE(replay.gen().Add(Request(1, prompt, kN - k)).ok());
    replay.RunToIdle();
    EXPECT_EQ(replay.out.tokens[1], std::vector<int32_t>(full.begin() + k, full.end()))
        << "k = " << k;
    EXPECT_EQ(replay.out.positions[1].front(), static_cast<int64_t>(prompt.size()));
  }
}

TEST(GeneratorTest, ConcurrentRequestsMatchSoloRunsUnderPreemption) {
  std::unique_ptr<TestModel> m = MakeTestModel(TinySpec());
  std::map<uint64_t, std::vector<int32_t>> solo;
  std::vector<GenerationRequest> requests;
  for (uint64_t id = 1; id <= 5; ++id) {
    std::vector<int32_t> prompt(3 + 4 * id, static_cast<int32_t>(60 + id));
    requests.push_back(Request(id, prompt, 10 + static_cast<int>(id), id * 17));
    Harness alone(*m, 64);
    ASSERT_TRUE(alone.gen().Add(requests.back()).ok());
    alone.RunToIdle();
    solo[id] = alone.out.tokens[id];
  }
  // 12 blocks of 4 tokens cannot hold all five at once: admission waits and preemption
  // recomputes; small step budgets cut prompts into chunks.
  Harness busy(*m, 12, 4, {4, 7});
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_TRUE(busy.gen().Add(requests[i]).ok());
    if (i % 2 == 1) {
      ASSERT_TRUE(busy.gen().Step().ok());  // arrivals between steps
    }
  }
  busy.RunToIdle();
  EXPECT_EQ(busy.out.tokens, solo);
}

TEST(GeneratorTest, StopsAtEosAndAtMaxPositions) {
  std::unique_ptr<TestModel> m = MakeTestModel(TinySpec());
  GenerationRequest greedy = Greedy();
  const std::vector<int32_t> tokens = GreedyTokens(*m, greedy);
  ASSERT_EQ(tokens.size(), 8u);

  m->config.eos_token_ids = {tokens[3]};
  Harness eos(*m, 64);
  greedy.stop_at_eos = true;
  ASSERT_TRUE(eos.gen().Add(greedy).ok());
  eos.RunToIdle();
  const size_t first = std::find(tokens.begin(), tokens.end(), tokens[3]) - tokens.begin();
  EXPECT_EQ(eos.out.tokens[1], std::vector<int32_t>(tokens.begin(), tokens.begin() + first + 1));
  EXPECT_EQ(eos.out.finish[1], FinishReason::kStop);

  ModelSpec short_spec = TinySpec();
  short_spec.max_position_embeddings = 16;
  std::unique_ptr<TestModel> short_model = MakeTestModel(short_spec);
  Harness limited(*short_model, 64);
  ASSERT_TRUE(limited.gen().Add(Request(2, kPrompt, 100)).ok());
  limited.RunToIdle();
  EXPECT_EQ(limited.out.tokens[2].size(), 16 - kPrompt.size());
  EXPECT_EQ(limited.out.positions[2].back(), 15);
  EXPECT_EQ(limited.out.finish[2], FinishReason::kLength);
}

// vLLM's stop_token_ids finish like eos; min_tokens keeps eos and the stop ids from being
// sampled until that many tokens are out, so the request goes on past them.
TEST(GeneratorTest, StopIdsAndMinTokens) {
  std::unique_ptr<TestModel> m = MakeTestModel(TinySpec());
  GenerationRequest greedy = Greedy();
  const std::vector<int32_t> tokens = GreedyTokens(*m, greedy);
  ASSERT_EQ(tokens.size(), 8u);
  const int32_t stop = tokens[1];
  const size_t first = std::find(tokens.begin(), tokens.end(), stop) - tokens.begin();

  Harness ids(*m, 64);
  GenerationRequest by_id = greedy;
  by_id.stop_token_ids = {stop};
  ASSERT_TRUE(ids.gen().Add(by_id).ok());
  ids.RunToIdle();
  EXPECT_EQ(ids.out.tokens[1], std::vector<int32_t>(tokens.begin(), tokens.begin() + first + 1));
  EXPECT_EQ(ids.out.finish[1], FinishReason::kStop);

  m->config.eos_token_ids = {stop};
  for (bool by_eos : {true, false}) {
    Harness held(*m, 64);
    GenerationRequest at_least = greedy;
    at_least.stop_at_eos = by_eos;
    if (!by_eos) at_least.stop_token_ids = {stop};
    at_least.min_tokens = 8;
    ASSERT_TRUE(held.gen().Add(at_least).ok());
    held.RunToIdle();
    const std::vector<int32_t>& got = held.out.tokens[1];
    EXPECT_EQ(got.size(), 8u) << by_eos;
    EXPECT_EQ(std::count(got.begin(), got.end(), stop), 0) << "masked while under min_tokens";
    EXPECT_EQ(held.out.finish[1], FinishReason::kLength);
    EXPECT_EQ(std::vector<int32_t>(got.begin(), got.begin() + first),
              std::vector<int32_t>(tokens.begin(), tokens.begin() + first))
        << "the same tokens up to the first stop id";
  }
}

TEST(GeneratorTest, AddRefusesBadRequests) {
  std::unique_ptr<TestModel> m = MakeTestModel(TinySpec());
  Harness h(*m, 4, 4);
  EXPECT_FALSE(h.gen().Add(Request(1, {}, 4)).ok());
  EXPECT_FALSE(h.gen().Add(Request(1, {1, 999}, 4)).ok());
  EXPECT_FALSE(h.gen().Add(Request(1, {1}, 0)).ok());
  GenerationRequest hot = Request(1, {1}, 4);
  hot.sampling.top_p = 0;
  EXPECT_FALSE(h.gen().Add(hot).ok());
  GenerationRequest more = Request(1, {1}, 4);
  more.min_tokens = 5;
  EXPECT_FALSE(h.gen().Add(more).ok());
  GenerationRequest outside = Request(1, {1}, 4);
  outside.stop_token_ids = {999};
  EXPECT_FALSE(h.gen().Add(outside).ok());
  Status big = h.gen().Add(Request(1, {1, 2, 3}, 20));  // 23 tokens: 6 blocks of 4
  EXPECT_EQ(big.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(big.message().find("needs 6 kv blocks, the cache has 4"), std::string::npos);
  EXPECT_FALSE(h.gen().Add(Request(1, std::vector<int32_t>(512, 1), 1)).ok());
  ASSERT_TRUE(h.gen().Add(Request(1, {1, 2}, 3)).ok());
  EXPECT_FALSE(h.gen().Add(Request(1, {1, 2}, 3)).ok());  // duplicate id
  EXPECT_TRUE(h.gen().idle() == false);
}

// A cache that shares a pool (a canary's share, or blocks returned to the controller) refuses
// what fits the pool but not the cache now as Unavailable: another engine may take it.
TEST(GeneratorTest, TooBigForNowButNotForThePoolIsUnavailable) {
  std::unique_ptr<TestModel> m = MakeTestModel(TinySpec());
  Harness h(*m, 4, 4);
  h.cache().SetReachableBlocks(8);
  Status later = h.gen().Add(Request(1, {1, 2, 3}, 20));  // 6 blocks: more than 4, within 8
  EXPECT_EQ(later.code(), StatusCode::kUnavailable) << later.ToString();
  Status never = h.gen().Add(Request(2, {1, 2, 3}, 36));  // 10 blocks: more than the pool
  EXPECT_EQ(never.code(), StatusCode::kResourceExhausted) << never.ToString();
}

TEST(GeneratorTest, CancelReleasesBlocks) {
  std::unique_ptr<TestModel> m = MakeTestModel(TinySpec());
  Harness h(*m, 16, 4);
  ASSERT_TRUE(h.gen().Add(Request(1, kPrompt, 20)).ok());
  ASSERT_TRUE(h.gen().Add(Request(2, kPrompt, 20)).ok());
  ASSERT_TRUE(h.gen().Step().ok());
  ASSERT_TRUE(h.gen().Step().ok());
  EXPECT_LT(h.cache().free_blocks(), 16u);
  EXPECT_TRUE(h.gen().Cancel(1));
  EXPECT_TRUE(h.gen().Cancel(2));
  EXPECT_FALSE(h.gen().Cancel(3));
  EXPECT_TRUE(h.gen().idle());
  EXPECT_EQ(h.cache().free_blocks(), 16u);
  EXPECT_EQ(h.out.tokens[1].size(), 2u);
}

}  // namespace
}  // namespace baton
