// FleetAdmission with the fake clock when operators drain nodes (`batonctl drain`: the node's
// table says `draining` or `stopped`): a drained node takes no request and hands its waiters
// to the other nodes serving the model; when every listed node serving the model is drained,
// requests are refused at once with FailedPrecondition (the router answers 503), the fleet
// queue's waiters too; a node merely failing over keeps requests waiting; a resumed node
// serves again.
#include <gtest/gtest.h>

#include "router/fleet/fleet_admission.h"

namespace baton {
namespace {

using std::chrono::milliseconds;

// A node of model "tiny" at `pair_state`, listing engine 1 at `role` (ready) unless `role` is
// empty.
FleetNode Node(const std::string& name, const std::string& pair_state,
               std::optional<proto::EngineRole> role = proto::EngineRole::kPrimary) {
  FleetNode n{.name = name, .model = "tiny", .controller_pid = 100, .controller_started_at = 1};
  n.routes.epoch = 1;
  n.routes.pair_state = pair_state;
  if (role) {
    n.routes.entries.push_back({.engine_id = 1,
                                .role = *role,
                                .http_address = "127.0.2." + name + ":1",
                                .ready = *role == proto::EngineRole::kPrimary});
  }
  return n;
}

FleetNode Stopped(const std::string& name) { return Node(name, "stopped", std::nullopt); }
FleetNode Draining(const std::string& name) {
  return Node(name, "draining", proto::EngineRole::kDraining);
}
FleetNode FailingOver(const std::string& name) { return Node(name, "failing_over", std::nullopt); }

struct Grants {
  std::vector<Result<Target>> got;
  Admitter::Grant Next() {
    return [this](Result<Target> t) { got.push_back(std::move(t)); };
  }
};

AdmitRequest New() { return {.model = "tiny"}; }

TEST(FleetAdmissionOutOfServiceTest, ADrainedNodeTakesNoRequest) {
  FakeClock clock;
  FleetAdmission f(clock, {});
  f.SetNodes({Stopped("a"), Node("b", "ready"), Draining("c")});
  EXPECT_FALSE(f.OutOfService("tiny"));
  Grants g;
  for (int i = 0; i < 4; ++i) f.Request(New(), g.Next());
  ASSERT_EQ(g.got.size(), 4u);
  for (const auto& t : g.got) {
    ASSERT_TRUE(t.ok());
    EXPECT_EQ(t->node, "b");
  }
}

TEST(FleetAdmissionOutOfServiceTest, EveryNodeDrainedRefusesAtOnce) {
  FakeClock clock;
  FleetAdmission f(clock, {.max_queue_wait = milliseconds(5000)});
  f.SetNodes({Stopped("a"), Draining("b")});
  EXPECT_TRUE(f.OutOfService("tiny"));
  EXPECT_TRUE(f.OutOfService(""));
  Grants g;
  f.Request(New(), g.Next());
  f.Request({.replay = true,
             .failed = Target{.address = "x", .engine_id = 1, .node = "b"},
             .model = "tiny"},
            g.Next());
  ASSERT_EQ(g.got.size(), 2u);
  for (const auto& r : g.got) {
    EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(r.status().message().find("batonctl resume"), std::string::npos);
  }
  EXPECT_EQ(f.queued(), 0u);
  std::vector<FleetNodeView> nodes = f.Nodes();
  ASSERT_EQ(nodes.size(), 2u);
  EXPECT_TRUE(nodes[0].out_of_service && nodes[1].out_of_service);
}

TEST(FleetAdmissionOutOfServiceTest, ANodeFailingOverStillQueues) {
  FakeClock clock;
  FleetAdmission f(clock, {.max_queue_wait = milliseconds(5000)});
  f.SetNodes({Stopped("a"), FailingOver("b")});
  EXPECT_FALSE(f.OutOfService("tiny"));
  Grants g;
  f.Request(New(), g.Next());
  EXPECT_TRUE(g.got.empty());
  EXPECT_EQ(f.queued(), 1u);
  f.SetNodes({Stopped("a"), Node("b", "ready")});  // b's new primary
  ASSERT_EQ(g.got.size(), 1u);
  ASSERT_TRUE(g.got[0].ok());
  EXPECT_EQ(g.got[0]->node, "b");
}

TEST(FleetAdmissionOutOfServiceTest, TheQueuedAreRefusedWhenTheLastNodeIsDrained) {
  FakeClock clock;
  FleetAdmission f(clock, {.max_queue_wait = milliseconds(5000)});
  f.SetNodes({Node("a", "down", std::nullopt), FailingOver("b")});
  Grants g;
  f.Request(New(), g.Next());
  f.Request(New(), g.Next());
  EXPECT_EQ(f.queued(), 2u);
  clock.Advance(milliseconds(100));
  f.SetNodes({Stopped("a"), FailingOver("b")});  // one still may come back: they wait
  EXPECT_TRUE(g.got.empty());
  f.SetNodes({Stopped("a"), Stopped("b")});
  ASSERT_EQ(g.got.size(), 2u);
  for (const auto& r : g.got) EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(f.queued(), 0u);
}

// A request waiting inside a node (its primary refused a connection) when that node is drained
// goes to another node of the model, where it waits for the failover to end.
TEST(FleetAdmissionOutOfServiceTest, ADrainedNodesWaitersGoToAnotherNode) {
  FakeClock clock;
  FleetAdmission f(clock, {.max_queue_wait = milliseconds(5000)});
  f.SetNodes({Node("a", "ready"), FailingOver("b")});
  f.Unreachable({.address = "127.0.2.a:1", .engine_id = 1, .node = "a"});
  Grants g;
  f.Request(New(), g.Next());
  EXPECT_TRUE(g.got.empty());
  f.SetNodes({Draining("a"), FailingOver("b")});
  EXPECT_TRUE(g.got.empty());  // not refused: b may come back
  f.SetNodes({Draining("a"), Node("b", "ready")});
  ASSERT_EQ(g.got.size(), 1u);
  ASSERT_TRUE(g.got[0].ok());
  EXPECT_EQ(g.got[0]->node, "b");
}

TEST(FleetAdmissionOutOfServiceTest, AResumedNodeAdmitsAgain) {
  FakeClock clock;
  FleetAdmission f(clock, {});
  f.SetNodes({Stopped("a")});
  Grants refused;
  f.Request(New(), refused.Next());
  ASSERT_EQ(refused.got.size(), 1u);
  EXPECT_FALSE(refused.got[0].ok());
  f.SetNodes({Node("a", "ready")});  // `batonctl resume`, and the new pair is ready
  EXPECT_FALSE(f.OutOfService("tiny"));
  Grants g;
  f.Request(New(), g.Next());
  ASSERT_EQ(g.got.size(), 1u);
  ASSERT_TRUE(g.got[0].ok());
  EXPECT_EQ(g.got[0]->node, "a");
}

}  // namespace
}  // namespace baton
