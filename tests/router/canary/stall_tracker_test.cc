// StallTracker: a stall is reported only when two evaluations in a row find it, by node and
// engine id (engine 1 of node "a" is not engine 1 of node "b" nor of the router's own
// controller), and is named as new once per stall: again only after it ended.
#include "router/canary/stall_tracker.h"

#include <gtest/gtest.h>

namespace baton {
namespace {

using std::chrono::milliseconds;

EngineProgress::Stall Stalled(const std::string& node, uint64_t engine, int quiet_ms) {
  return {.node = node, .engine_id = engine, .streams = 1, .quiet = milliseconds(quiet_ms)};
}

TEST(StallTrackerTest, AStallIsReportedFromItsSecondEvaluationByNode) {
  StallTracker t;
  StallTracker::Confirmed c = t.Confirm({Stalled("", 1, 1000), Stalled("a", 1, 1000)});
  EXPECT_TRUE(c.by_node.empty()) << "found once: not yet";
  EXPECT_TRUE(c.first.empty());
  c = t.Confirm({Stalled("", 1, 1250), Stalled("a", 1, 1250), Stalled("b", 1, 1000)});
  ASSERT_EQ(c.by_node.size(), 2u) << "b's engine 1 is another engine, found once";
  ASSERT_EQ(c.by_node[""].size(), 1u);
  EXPECT_EQ(c.by_node[""][0].engine_id, 1u);
  EXPECT_EQ(c.by_node[""][0].quiet_ms, 1250u);
  ASSERT_EQ(c.by_node["a"].size(), 1u);
  EXPECT_EQ(c.by_node["a"][0].streams, 1u);
  ASSERT_EQ(c.first.size(), 2u);
  EXPECT_EQ(c.first[1].node, "a");
  c = t.Confirm({Stalled("a", 1, 1500), Stalled("b", 1, 1250)});
  EXPECT_EQ(c.by_node.size(), 2u) << "a lasts, b is confirmed, \"\" moved";
  ASSERT_EQ(c.first.size(), 1u) << "a was named new already";
  EXPECT_EQ(c.first[0].node, "b");
  c = t.Confirm({Stalled("", 1, 1000)});  // "" stalls again: a new stall, found once
  EXPECT_TRUE(c.by_node.empty());
  c = t.Confirm({Stalled("", 1, 1250)});
  ASSERT_EQ(c.first.size(), 1u);
  EXPECT_EQ(c.first[0].node, "");
}

TEST(StallTrackerTest, ResetForgetsEveryStall) {
  StallTracker t;
  (void)t.Confirm({Stalled("a", 3, 1000)});
  (void)t.Confirm({Stalled("a", 3, 1250)});
  t.Reset();
  EXPECT_TRUE(t.Confirm({Stalled("a", 3, 1500)}).by_node.empty()) << "found once since";
  StallTracker::Confirmed c = t.Confirm({Stalled("a", 3, 1750)});
  EXPECT_EQ(c.by_node["a"].size(), 1u);
  EXPECT_EQ(c.first.size(), 1u) << "named new again after a reset";
}

}  // namespace
}  // namespace baton
