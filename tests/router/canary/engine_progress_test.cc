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

TEST(EngineProgressTest, EnginesAreJudgedApartByNode) {
  FakeClock clock;
  EngineProgress p;
  p.Begin("", 1, clock.Now());
  const uint64_t moving = p.Begin("", 2, clock.Now());
  p.Begin("node-b", 1, clock.Now());  // a fleet node's engine 1: another engine
  const uint64_t b2 = p.Begin("node-b", 2, clock.Now());
  clock.Advance(milliseconds(5000));
  p.Advanced(moving, clock.Now());
  p.Advanced(b2, clock.Now());
  std::vector<EngineProgress::Stall> stalled = p.Stalled(clock.Now(), milliseconds(1000));
  ASSERT_EQ(stalled.size(), 2u);
  EXPECT_EQ(stalled[0].node, "");
  EXPECT_EQ(stalled[0].engine_id, 1u);
  EXPECT_EQ(stalled[0].streams, 1u);
  EXPECT_EQ(stalled[1].node, "node-b");
  EXPECT_EQ(stalled[1].engine_id, 1u);
  EXPECT_EQ(stalled[1].quiet, milliseconds(5000));
}

}  // namespace
}  // namespace baton
