#include "standby/kv/kv_handoff.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "tests/standby/llama_testutil.h"

namespace baton {
namespace {

constexpr int kBlockTokens = 4;
constexpr int kBlocks = 48;
constexpr uint64_t kIdentity = 0x5EED;

const std::vector<int32_t> kPrompt = {256, 84, 104, 101, 32, 113, 117, 105, 99, 107, 32, 98, 114};

KvRequestKey Key(uint64_t n) { return {0xC0FFEE, n}; }

GenerationRequest Request(uint64_t id, std::vector<int32_t> prompt, int max_tokens,
                          uint64_t seed = 1234) {
  GenerationRequest r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling = {0.9f, 0.95f, seed};
  r.stop_at_eos = false;
  r.key = Key(id);
  return r;
}

// One engine over a pool of kBlocks blocks laid out as kv_record.h says: a model, a cache
// over the pool's KV data, a KvHandoff at `epoch` and a Generator with it as hooks.
class Engine {
 public:
  Engine(const TestModel& m, std::vector<uint64_t> pool, uint64_t epoch, FakeClock* clock,
         uint64_t identity = kIdentity, int max_step_tokens = 512)
      : pool_(std::move(pool)), epoch_(epoch) {
    model_ = LlamaModel::Create(m.config, m.table, {1}).value();
    cache_ = std::make_unique<PagedKvCache>(
        PagedKvCache::Create(model_->MakeKvLayout(kBlockTokens)).value());
    KvHandoffOptions options;
    options.identity = identity;
    options.block_tokens = kBlockTokens;
    options.block = [this](uint32_t b) { return Block(b); };
    options.epoch = [this] { return epoch_; };
    options.block_bytes = BlockBytes(m);
    options.keep_for = std::chrono::seconds(30);
    options.clock = clock;
    options.metrics = &metrics;
    handoff_ = std::make_unique<KvHandoff>(cache_.get(), std::move(options));
    GeneratorOptions gen_options;
    gen_options.max_step_tokens = max_step_tokens;
    gen_options.kv_hooks = handoff_.get();
    gen_ = std::make_unique<Generator>(model_.get(), cache_.get(), gen_options,
                                       [this](const TokenEvent& e) { Record(e); });
  }

  static uint64_t BlockBytes(const TestModel& m) {
    auto model = LlamaModel::Create(m.config, m.table, {1}).value();
    return KvDataOffset(kBlockTokens) + kBlockTokens * model->MakeKvLayout(1).block_bytes();
  }
  static std::vector<uint64_t> FreshPool(const TestModel& m) {
    return std::vector<uint64_t>(BlockBytes(m) * kBlocks / 8, 0);
  }

  uint8_t* Block(uint32_t b) {
    return reinterpret_cast<uint8_t*>(pool_.data()) + uint64_t{b} * block_bytes();
  }
  uint64_t block_bytes() const {
    return KvDataOffset(kBlockTokens) + cache_->layout().block_bytes();
  }

  // Adds blocks [first, end) to the cache, `held` or free.
  Status Add(uint32_t b, bool held) {
    uint8_t* data = Block(b) + KvDataOffset(kBlockTokens);
    const uint64_t bytes = block_bytes() - KvDataOffset(kBlockTokens);
    return held ? cache_->AddHeldBlock(b, data, bytes) : cache_->AddBlock(b, data, bytes);
  }
  void AddFree(uint32_t first, uint32_t end) {
    for (uint32_t b = first; b < end; ++b) {
      if (added_.count(b) == 0) {
        ASSERT_TRUE(Add(b, false).ok());
        added_.insert(b);
      }
    }
  }

  // What a promotion does: the SDK copies the headers of `runs` and scrubs them; the
  // handoff adopts; the other blocks become free.
  KvAdoptionReport Inherit(const std::vector<KvBlockRun>& runs, bool add_rest = true) {
    std::vector<uint8_t> headers;
    for (const KvBlockRun& r : runs) {
      for (uint32_t b = r.first; b < r.first + r.count; ++b) {
        headers.insert(headers.end(), Block(b), Block(b) + kKvRecordHeaderBytes);
        std::memset(Block(b), 0, kKvRecordHeaderBytes);
      }
    }
    KvAdoptionReport report = handoff_->Adopt(runs, headers, [this](uint32_t b) {
      added_.insert(b);
      return Add(b, true);
    });
    if (add_rest) {
      for (const KvBlockRun& r : runs) AddFree(r.first, r.first + r.count);
    }
    return report;
  }

  // A promotion before the barrier: the quarantined `runs` (read-only, headers not scrubbed)
  // are planned and copied into the free blocks of [first, end), `between` run after each
  // sequence's copy (a dying writer); the rest of [first, end) becomes free.
  KvAdoptionReport Copy(const std::vector<KvBlockRun>& runs, uint32_t first, uint32_t end,
                        const std::function<void()>& between = nullptr) {
    std::vector<uint8_t> headers;
    for (const KvBlockRun& r : runs) {
      for (uint32_t b = r.first; b < r.first + r.count; ++b) {
        headers.insert(headers.end(), Block(b), Block(b) + kKvRecordHeaderBytes);
      }
    }
    const KvCopyPlan plan = handoff_->PlanCopy(runs, headers);
    uint32_t next = first;
    auto take = [&]() -> Result<uint32_t> {
      while (next < end && added_.count(next) != 0) ++next;
      if (next == end) return ResourceExhausted("no block left to copy into");
      added_.insert(next);
      BATON_RETURN_IF_ERROR(Add(next, true));
      return next++;
    };
    KvAdoptionReport report = handoff_->CopyIn(plan, take, between);
    AddFree(first, end);
    return report;
  }

  void Record(const TokenEvent& e) {
    if (e.token >= 0) tokens[e.request_id].push_back(e.token);
  }
  void Step() { ASSERT_TRUE(gen_->Step().ok()); }
  void RunToIdle() {
    for (int i = 0; i < 10000 && !gen_->idle(); ++i) Step();
    ASSERT_TRUE(gen_->idle());
  }
  // The pool as a successor finds it after this engine was killed at this point.
  std::vector<uint64_t> Crash() const { return pool_; }

  Generator& gen() { return *gen_; }
  KvHandoff& handoff() { return *handoff_; }
  PagedKvCache& cache() { return *cache_; }
  std::map<uint64_t, std::vector<int32_t>> tokens;
  EngineMetrics metrics;

 private:
  std::vector<uint64_t> pool_;
  uint64_t epoch_;
  std::set<uint32_t> added_;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<PagedKvCache> cache_;
  std::unique_ptr<KvHandoff> handoff_;
  std::unique_ptr<Generator> gen_;
};

class KvHandoffTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = MakeTestModel(TinySpec(DType::kBF16));
    Engine alone(*model_, Engine::FreshPool(*model_), 1, &clock_);
    alone.AddFree(0, kBlocks);
    ASSERT_TRUE(alone.gen().Add(Request(1, kPrompt, kTokens)).ok());
    alone.RunToIdle();
    full_ = alone.tokens[1];
    ASSERT_EQ(full_.size(), static_cast<size_t>(kTokens));
    // A finished request leaves no record behind: every block of the pool is free again.
    for (uint32_t b = 0; b < kBlocks; ++b) {
      ASSERT_EQ(ReadKvRecord(alone.Block(b), alone.Block(b) + 64, kBlockTokens).state,
                KvRecordState::kAbsent);
    }
  }

  // Runs request 1 on a primary for `steps` steps, then "kills" it. The primary holds blocks
  // [0, `held`) of `pool` (a fresh one when empty).
  std::vector<uint64_t> PrimaryKilledAfter(int steps, std::vector<int32_t>* sent,
                                           int max_step_tokens = 512, uint32_t first = 0,
                                           uint32_t held = kBlocks,
                                           std::vector<uint64_t> pool = {}) {
    if (pool.empty()) pool = Engine::FreshPool(*model_);
    Engine primary(*model_, std::move(pool), 1, &clock_, kIdentity, max_step_tokens);
    primary.AddFree(first, held);
    EXPECT_TRUE(primary.gen().Add(Request(1, kPrompt, kTokens)).ok());
    for (int i = 0; i < steps; ++i) primary.Step();
    *sent = primary.tokens[1];
    return primary.Crash();
  }

  // The router's replay of request 1 after `sent` tokens, on `engine`.
  void Replay(Engine* engine, const std::vector<int32_t>& sent) {
    std::vector<int32_t> prompt = kPrompt;
    prompt.insert(prompt.end(), sent.begin(), sent.end());
    ASSERT_TRUE(
        engine->gen().Add(Request(1, prompt, kTokens - static_cast<int>(sent.size()))).ok());
    engine->RunToIdle();
    std::vector<int32_t> whole = sent;
    whole.insert(whole.end(), engine->tokens[1].begin(), engine->tokens[1].end());
    EXPECT_EQ(whole, full_) << "after " << sent.size() << " tokens sent";
  }

  static constexpr int kTokens = 20;
  FakeClock clock_;
  std::unique_ptr<TestModel> model_;
  std::vector<int32_t> full_;
};

TEST_F(KvHandoffTest, SuccessorContinuesFromTheKvBitwiseTheSame) {
  // Cut after the prefill, at the first decodes, on a block boundary and late.
  for (int steps : {1, 2, 4, 7, 15}) {
    std::vector<int32_t> sent;
    std::vector<uint64_t> pool = PrimaryKilledAfter(steps, &sent);
    Engine successor(*model_, pool, 2, &clock_);
    const KvAdoptionReport report = successor.Inherit({{0, kBlocks}});
    EXPECT_EQ(report.adopted, 1u) << steps;
    EXPECT_EQ(report.dropped_total(), 0u) << steps;
    // The KV holds every token but the last sampled one.
    EXPECT_EQ(report.tokens, kPrompt.size() + sent.size() - 1) << steps;
    Replay(&successor, sent);
    const EngineMetrics::KvCounters kv = successor.metrics.kv();
    EXPECT_EQ(kv.continued, 1u);
    EXPECT_EQ(kv.tokens_not_recomputed, kPrompt.size() + sent.size() - 1);
    EXPECT_EQ(successor.handoff().kept(), 0u);
  }
}

TEST_F(KvHandoffTest, CutInsideThePrefillContinuesThePrefill) {
  std::vector<int32_t> sent;
  std::vector<uint64_t> pool = PrimaryKilledAfter(2, &sent, /*max_step_tokens=*/5);
  ASSERT_TRUE(sent.empty());  // 10 of the 13 prompt tokens are in the KV
  Engine successor(*model_, pool, 2, &clock_);
  const KvAdoptionReport report = successor.Inherit({{0, kBlocks}});
  ASSERT_EQ(report.adopted, 1u);
  EXPECT_EQ(report.tokens, 10u);
  Replay(&successor, sent);  // sent again whole, with the same key
  EXPECT_EQ(successor.metrics.kv().tokens_not_recomputed, 10u);
}

TEST_F(KvHandoffTest, ReplayThatSentLessThanTheKvHoldsUsesItsPrefix) {
  std::vector<int32_t> sent;
  std::vector<uint64_t> pool = PrimaryKilledAfter(9, &sent);
  ASSERT_GT(sent.size(), 5u);
  sent.resize(3);  // the last tokens were lost on the way to the router
  Engine successor(*model_, pool, 2, &clock_);
  ASSERT_EQ(successor.Inherit({{0, kBlocks}}).adopted, 1u);
  Replay(&successor, sent);
  EXPECT_EQ(successor.metrics.kv().tokens_not_recomputed, kPrompt.size() + 2);
}

TEST_F(KvHandoffTest, PromptThatDiffersFromTheFirstTokenIsPrefilledWhole) {
  std::vector<int32_t> sent;
  std::vector<uint64_t> pool = PrimaryKilledAfter(5, &sent);
  Engine successor(*model_, pool, 2, &clock_);
  ASSERT_EQ(successor.Inherit({{0, kBlocks}}).adopted, 1u);
  GenerationRequest other = Request(1, {7, 8, 9}, 4);
  ASSERT_TRUE(successor.gen().Add(other).ok());
  successor.RunToIdle();
  EXPECT_EQ(successor.metrics.kv().kept_freed.at("mismatch"), 1u);
  EXPECT_EQ(successor.metrics.kv().continued, 0u);
  EXPECT_EQ(successor.cache().free_blocks(), successor.cache().total_blocks());
}

TEST_F(KvHandoffTest, TornRecordDropsTheSequenceAndReplayPrefills) {
  std::vector<int32_t> sent;
  std::vector<uint64_t> pool = PrimaryKilledAfter(6, &sent);
  Engine successor(*model_, pool, 2, &clock_);
  // The writer died inside the commit of one block of the sequence.
  bool torn = false;
  for (uint32_t b = 0; b < kBlocks && !torn; ++b) {
    if (ReadKvRecord(successor.Block(b), successor.Block(b) + 64, kBlockTokens).state ==
        KvRecordState::kValid) {
      reinterpret_cast<uint32_t*>(successor.Block(b))[1] += 1;
      torn = true;
    }
  }
  ASSERT_TRUE(torn);
  const KvAdoptionReport report = successor.Inherit({{0, kBlocks}});
  EXPECT_EQ(report.adopted, 0u);
  EXPECT_EQ(report.dropped.at("torn"), 1u);
  EXPECT_EQ(successor.metrics.kv().dropped.at("torn"), 1u);
  Replay(&successor, sent);
  EXPECT_EQ(successor.metrics.kv().continued, 0u);
}

TEST_F(KvHandoffTest, ChainNamingABlockOutsideTheGrantIsRefused) {
  std::vector<int32_t> sent;
  std::vector<uint64_t> pool = PrimaryKilledAfter(6, &sent);
  Engine successor(*model_, pool, 2, &clock_);
  // The sequence's blocks are 0.. in order (a fresh cache hands them out so): grant all
  // but block 0.
  const KvAdoptionReport report = successor.Inherit({{1, kBlocks - 1}});
  EXPECT_EQ(report.adopted, 0u);
  EXPECT_EQ(report.dropped.at("not_granted"), 1u);
  Replay(&successor, sent);
}

TEST_F(KvHandoffTest, OtherIdentityOrLaterEpochAdoptsNothing) {
  std::vector<int32_t> sent;
  std::vector<uint64_t> pool = PrimaryKilledAfter(6, &sent);
  Engine canary(*model_, pool, 2, &clock_, kIdentity + 1);
  EXPECT_EQ(canary.Inherit({{0, kBlocks}}).dropped.at("identity"), 1u);
  Replay(&canary, sent);

  Engine older(*model_, pool, 1, &clock_);  // not above the writer's epoch
  EXPECT_EQ(older.Inherit({{0, kBlocks}}).dropped.at("epoch"), 1u);
}

TEST_F(KvHandoffTest, KeptKvExpiresOrYieldsToNewRequests) {
  std::vector<int32_t> sent;
  std::vector<uint64_t> pool = PrimaryKilledAfter(6, &sent);
  Engine successor(*model_, pool, 2, &clock_);
  ASSERT_EQ(successor.Inherit({{0, kBlocks}}).adopted, 1u);
  const size_t free_before = successor.cache().free_blocks();
  clock_.Advance(std::chrono::seconds(29));
  EXPECT_EQ(successor.handoff().Expire(), 0u);
  // A request that needs every block evicts the kept sequence.
  ASSERT_TRUE(successor.gen().Add(Request(9, std::vector<int32_t>(kBlocks * 4 - 8, 65), 2)).ok());
  successor.RunToIdle();
  EXPECT_EQ(successor.metrics.kv().kept_freed.at("evicted"), 1u);
  EXPECT_GT(successor.cache().free_blocks(), free_before);

  Engine again(*model_, pool, 2, &clock_);
  ASSERT_EQ(again.Inherit({{0, kBlocks}}).adopted, 1u);
  clock_.Advance(std::chrono::seconds(30));
  EXPECT_EQ(again.handoff().Expire(), 1u);
  EXPECT_EQ(again.cache().free_blocks(), again.cache().total_blocks());
  // Freed blocks carry no record: the next successor finds nothing.
  Engine third(*model_, again.Crash(), 3, &clock_);
  const KvAdoptionReport none = third.Inherit({{0, kBlocks}});
  EXPECT_EQ(none.adopted, 0u);
  EXPECT_EQ(none.dropped_total(), 0u);
}

TEST_F(KvHandoffTest, HandOverParksForTheNextPrimaryOrForItself) {
  Engine primary(*model_, Engine::FreshPool(*model_), 1, &clock_);
  primary.AddFree(0, kBlocks);
  ASSERT_TRUE(primary.gen().Add(Request(1, kPrompt, kTokens)).ok());
  GenerationRequest unkeyed = Request(2, {256, 1, 2}, 3);
  unkeyed.key = {};
  ASSERT_TRUE(primary.gen().Add(unkeyed).ok());
  for (int i = 0; i < 5; ++i) primary.Step();
  const std::vector<int32_t> sent = primary.tokens[1];
  EXPECT_EQ(primary.gen().HandOver(), std::vector<uint64_t>{1});
  EXPECT_EQ(primary.handoff().kept(), 1u);
  EXPECT_EQ(primary.metrics.kv().handed_over, 1u);
  primary.RunToIdle();  // the unkeyed request finishes here
  EXPECT_EQ(primary.tokens[2].size(), 3u);

  // A switch-over: the next primary adopts the parked sequence.
  Engine next(*model_, primary.Crash(), 2, &clock_);
  ASSERT_EQ(next.Inherit({{0, kBlocks}}).adopted, 1u);
  Replay(&next, sent);

  // A switch-over called off: the same engine takes it back.
  primary.tokens.clear();
  Replay(&primary, sent);
  EXPECT_EQ(primary.metrics.kv().continued, 1u);
}

// Promoted before the primary's barrier: the sequence is copied out of the quarantined
// blocks into the successor's own, which continue it bitwise the same; the quarantined
// blocks are only read.
TEST_F(KvHandoffTest, CopyBeforeTheBarrierContinuesBitwiseTheSame) {
  for (int steps : {2, 7, 15}) {
    std::vector<int32_t> sent;
    std::vector<uint64_t> pool = PrimaryKilledAfter(steps, &sent, 512, 0, kBlocks / 2);
    Engine successor(*model_, pool, 2, &clock_);
    const std::vector<uint8_t> before(successor.Block(0), successor.Block(kBlocks / 2));
    const KvAdoptionReport report = successor.Copy({{0, kBlocks / 2}}, kBlocks / 2, kBlocks);
    EXPECT_EQ(report.adopted, 1u) << steps;
    EXPECT_EQ(report.dropped_total(), 0u) << steps;
    EXPECT_EQ(report.tokens, kPrompt.size() + sent.size() - 1) << steps;
    EXPECT_TRUE(std::equal(before.begin(), before.end(), successor.Block(0)))
        << "the quarantined blocks are not written";
    Replay(&successor, sent);
    EXPECT_EQ(successor.metrics.kv().continued, 1u);
    EXPECT_EQ(successor.metrics.kv().tokens_not_recomputed, kPrompt.size() + sent.size() - 1);
  }
}

// The dying writer moves on while the copy is made (it frees the sequence and its record is
// cleared, or it commits another step): the copy is dropped and its blocks are free again.
TEST_F(KvHandoffTest, ARecordThatChangesDuringTheCopyDropsTheCopy) {
  std::vector<int32_t> sent;
  std::vector<uint64_t> pool = PrimaryKilledAfter(7, &sent, 512, 0, kBlocks / 2);
  for (bool clear : {true, false}) {
    Engine successor(*model_, pool, 2, &clock_);
    uint32_t source = kBlocks;
    for (uint32_t b = 0; b < kBlocks / 2 && source == kBlocks; ++b) {
      if (ReadKvRecord(successor.Block(b), successor.Block(b) + 64, kBlockTokens).state ==
          KvRecordState::kValid) {
        source = b;
      }
    }
    ASSERT_LT(source, static_cast<uint32_t>(kBlocks));
    const KvAdoptionReport report = successor.Copy({{0, kBlocks / 2}}, kBlocks / 2, kBlocks, [&] {
      if (clear) return ClearKvRecord(successor.Block(source));
      reinterpret_cast<uint32_t*>(successor.Block(source))[1] += 2;  // a later commit
    });
    EXPECT_EQ(report.adopted, 0u) << clear;
    EXPECT_EQ(report.dropped.at("changed"), 1u) << clear;
    EXPECT_EQ(successor.cache().free_blocks(), successor.cache().total_blocks());
    Replay(&successor, sent);  // replayed: prefilled whole
    EXPECT_EQ(successor.metrics.kv().continued, 0u);
  }
}

// One request found twice (an older, shorter commit in a promoted block, the newer one in the
// quarantine): the longer is kept, the other freed.
TEST_F(KvHandoffTest, OfTwoKeptCopiesOfOneRequestTheLongerStays) {
  std::vector<int32_t> early, late;
  std::vector<uint64_t> pool = PrimaryKilledAfter(2, &early, 512, kBlocks / 2, kBlocks);
  pool = PrimaryKilledAfter(9, &late, 512, 0, kBlocks / 2, std::move(pool));
  Engine successor(*model_, pool, 2, &clock_);
  // The shorter, in place in promoted blocks; the others of them are copied into.
  ASSERT_EQ(successor.Inherit({{kBlocks / 2, kBlocks / 2}}, /*add_rest=*/false).adopted, 1u);
  const KvAdoptionReport copied = successor.Copy({{0, kBlocks / 2}}, kBlocks / 2, kBlocks);
  EXPECT_EQ(copied.adopted, 1u);
  EXPECT_EQ(successor.handoff().kept(), 1u);
  EXPECT_EQ(successor.metrics.kv().kept_freed.at("replaced"), 1u);
  Replay(&successor, late);
  EXPECT_EQ(successor.metrics.kv().tokens_not_recomputed, kPrompt.size() + late.size() - 1);
}

}  // namespace
}  // namespace baton
