// EngineLoop's pacing (SetStepInterval): with an interval, a stream gets its next token only
// once the loop's clock has moved on by the interval, and a cancel sent meanwhile is applied
// without waiting for it; without one, a generation runs to its end with the clock stopped.
// The clock is a FakeClock, so nothing here depends on how fast the machine is.
#include "standby/engine_loop.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "base/mutex.h"
#include "tests/standby/llama_testutil.h"

namespace baton {
namespace {

using std::chrono::milliseconds;

// Collects one request's events from the compute thread.
class Events {
 public:
  void Add(const EngineEvent& e) {
    MutexLock lock(mu_);
    if (e.token.token >= 0) ++tokens_;
    if (e.token.finish != FinishReason::kNone) done_ = true;
  }
  int tokens() {
    MutexLock lock(mu_);
    return tokens_;
  }
  bool done() {
    MutexLock lock(mu_);
    return done_;
  }
  // Polls (real time, generous) until `tokens()` reaches `n`; false if it never does.
  bool WaitForTokens(int n) {
    for (int i = 0; i < 10000 && tokens() < n; ++i) std::this_thread::sleep_for(milliseconds(1));
    return tokens() >= n;
  }

 private:
  Mutex mu_;
  int tokens_ BATON_GUARDED_BY(mu_) = 0;
  bool done_ BATON_GUARDED_BY(mu_) = false;
};

class EngineLoopTest : public ::testing::Test {
 protected:
  void SetUp() override {
    test_model_ = MakeTestModel(TinySpec());
    model_ = LlamaModel::Create(test_model_->config, test_model_->table, {1}).value();
    cache_ = std::make_unique<PagedKvCache>(PagedKvCache::Create(model_->MakeKvLayout(16)).value());
    memory_.resize(cache_->layout().block_bytes() / 4 * 16);
    ASSERT_TRUE(cache_->AddRegion(0, memory_.data(), cache_->layout().block_bytes(), 16).ok());
    loop_ = std::make_unique<EngineLoop>(model_.get(), cache_.get(), GeneratorOptions{}, &metrics_,
                                         clock_);
  }

  // Events outlives the loop (declared before it): the loop calls sinks until it stops.
  uint64_t Submit(Events* events, int max_tokens) {
    GenerationRequest r;
    r.prompt = {256, 84, 104, 101};
    r.max_tokens = max_tokens;
    r.stop_at_eos = false;
    return loop_->Submit(std::move(r), [events](const EngineEvent& e) { events->Add(e); });
  }

  std::unique_ptr<TestModel> test_model_;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<PagedKvCache> cache_;
  std::vector<float> memory_;
  EngineMetrics metrics_;
  FakeClock clock_;
  Events events_;
  std::unique_ptr<EngineLoop> loop_;
};

TEST_F(EngineLoopTest, WithoutAnIntervalAGenerationRunsToItsEndWhileTheClockStands) {
  loop_->Start();
  Submit(&events_, 8);
  ASSERT_TRUE(events_.WaitForTokens(8));
  for (int i = 0; i < 1000 && !events_.done(); ++i) std::this_thread::sleep_for(milliseconds(1));
  EXPECT_TRUE(events_.done());
}

TEST_F(EngineLoopTest, WithAnIntervalEachTokenWaitsForTheClock) {
  loop_->SetStepInterval(std::chrono::seconds(1));
  loop_->Start();
  Submit(&events_, 8);
  ASSERT_TRUE(events_.WaitForTokens(1));
  for (int step = 1; step < 4; ++step) {
    // The clock stands: no further token, however long the machine gives the loop.
    std::this_thread::sleep_for(milliseconds(50));
    EXPECT_EQ(events_.tokens(), step);
    clock_.Advance(std::chrono::seconds(1));
    ASSERT_TRUE(events_.WaitForTokens(step + 1)) << "step " << step;
  }
  EXPECT_FALSE(events_.done());
}

TEST_F(EngineLoopTest, ACancelDuringThePauseIsAppliedAndStopEndsThePause) {
  loop_->SetStepInterval(std::chrono::hours(1));
  loop_->Start();
  const uint64_t id = Submit(&events_, 8);
  ASSERT_TRUE(events_.WaitForTokens(1));
  loop_->Cancel(id);
  for (int i = 0; i < 10000 && loop_->pending() > 0; ++i) {
    std::this_thread::sleep_for(milliseconds(1));
  }
  EXPECT_EQ(loop_->pending(), 0u);  // applied within the hour-long pause
  loop_->Stop();                    // returns: the pause ends on stop
  EXPECT_EQ(events_.tokens(), 1);
}

}  // namespace
}  // namespace baton
