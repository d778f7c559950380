#include "router/canary/engine_progress.h"

#include <gtest/gtest.h>

namespace baton {
namespace {

using std::chrono::milliseconds;

TEST(EngineProgressTest, AnEngineIsStalledOnlyWhenEveryAnsweringStreamStandsStill) {
  FakeClock clock;
  EngineProgress p;
  EXPECT_TRUE(p.Stalled(clock.Now(), milliseconds(1000)).empty()) << "no stream: no stall";
  const uint64_t a = p.Begin("", 7, clock.Now());
  const uint64_t b = p.Begin("", 7, clock.Now());
  clock.Advance(milliseconds(900));
  p.Advanced(b, clock.Now());
  clock.Advance(milliseconds(900));  // a quiet 1800 ms, b 900 ms: b moves, the engine works
  EXPECT_TRUE(p.Stalled(clock.Now(), milliseconds(1000)).empty());
  clock.Advance(milliseconds(200));
  std::vector<EngineProgress::Stall> stalled = p.Stalled(clock.Now(), milliseconds(1000));
  ASSERT_EQ(stalled.size(), 1u);
  EXPECT_EQ(stalled[0].engine_id, 7u);
  EXPECT_EQ(stalled[0].streams, 2u);
  EXPECT_EQ(stalled[0].quiet, milliseconds(1100));
  p.End(a);
  p.End(b);
  EXPECT_TRUE(p.Stalled(clock.Now(), milliseconds(1000)).empty()) << "ended streams count not";
  p.End(b);  // unknown: nothing
}

TEST(EngineProgressTest, EnginesAreJudgedApartAndFleetNodesNotAtAll) {
  FakeClock clock;
  EngineProgress p;
  p.Begin("", 1, clock.Now());
  const uint64_t moving = p.Begin("", 2, clock.Now());
  p.Begin("node-b", 1, clock.Now());  // a fleet node's engine: its own controller's business
  clock.Advance(milliseconds(5000));
  p.Advanced(moving, clock.Now());
  std::vector<EngineProgress::Stall> stalled = p.Stalled(clock.Now(), milliseconds(1000));
  ASSERT_EQ(stalled.size(), 1u);
  EXPECT_EQ(stalled[0].engine_id, 1u);
  EXPECT_EQ(stalled[0].streams, 1u);
}

}  // namespace
}  // namespace baton
