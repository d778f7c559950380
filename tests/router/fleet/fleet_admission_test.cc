// FleetAdmission with the fake clock: requests spread over the nodes that serve their model
// (least in flight, then the pool use their records report), replays leave the node that failed
// them, a node a replay failed on is passed over for a while, a node that leaves hands its waiters
// to another node and tells the attempts watched on it, an unknown model is refused, requests
// wait while no node has a primary, and a node that stays away is forgotten once nothing of it
// is left.
#include "router/fleet/fleet_admission.h"

#include <gtest/gtest.h>

#include <map>

namespace baton {
namespace {

using std::chrono::milliseconds;

FleetNode Node(const std::string& name, const std::string& model, uint64_t engine,
               const std::string& address, bool ready = true) {
  FleetNode n{.name = name, .model = model, .controller_pid = 100, .controller_started_at = 1};
  n.routes.epoch = 1;
  n.routes.entries.push_back({.engine_id = engine,
                              .role = proto::EngineRole::kPrimary,
                              .http_address = address,
                              .ready = ready});
  return n;
}

struct Grants {
  std::vector<Result<Target>> got;
  Admitter::Grant Next() {
    return [this](Result<Target> t) { got.push_back(std::move(t)); };
  }
};

AdmitRequest New(const std::string& model = "tiny") { return {.model = model}; }

TEST(FleetAdmissionTest, SpreadsNewRequestsOverTheNodesByLeastInFlight) {
  FakeClock clock;
  FleetAdmission f(clock, {});
  f.SetNodes({Node("a", "tiny", 1, "127.0.2.1:1"), Node("b", "tiny", 1, "127.0.2.2:1"),
              Node("c", "tiny", 1, "127.0.2.3:1")});
  Grants g;
  for (int i = 0; i < 9; ++i) f.Request(New(), g.Next());
  std::map<std::string, int> by_node;
  for (const auto& t : g.got) {
    ASSERT_TRUE(t.ok());
    ++by_node[t->node];
    EXPECT_EQ(t->engine_id, 1u);
  }
  EXPECT_EQ(by_node, (std::map<std::string, int>{{"a", 3}, {"b", 3}, {"c", 3}}));
  // Two of a's end: the next two go there.
  f.Release(*g.got[0]);
  f.Release(*g.got[3]);
  Grants next;
  f.Request(New(), next.Next());
  f.Request(New(), next.Next());
  ASSERT_EQ(next.got.size(), 2u);
  EXPECT_EQ(next.got[0]->node, "a");
  EXPECT_EQ(next.got[1]->node, "a");
  EXPECT_EQ(f.in_flight(), 9u);
}

TEST(FleetAdmissionTest, ANodeReportingAFullerPoolIsPassedOverAtEqualInFlight) {
  FakeClock clock;
  FleetAdmission f(clock, {});
  FleetNode a = Node("a", "tiny", 1, "127.0.2.1:1");
  FleetNode b = Node("b", "tiny", 1, "127.0.2.2:1");
  FleetNode c = Node("c", "tiny", 1, "127.0.2.3:1");
  a.pool_blocks = b.pool_blocks = c.pool_blocks = 100;
  a.pool_granted_blocks = 80;  // fuller than b by more than the band
  b.pool_granted_blocks = 10;
  c.pool_granted_blocks = 15;  // within the band of b: takes turns with it
  f.SetNodes({a, b, c});
  Grants g;
  for (int i = 0; i < 4; ++i) {
    f.Request(New(), g.Next());
    f.Release(*g.got.back());  // in flight stays equal (0) everywhere
  }
  std::map<std::string, int> by_node;
  for (const auto& t : g.got) ++by_node[t->node];
  EXPECT_EQ(by_node, (std::map<std::string, int>{{"b", 2}, {"c", 2}}));
  // In flight comes first: with b and c busy, a takes the next request.
  Grants busy;
  f.Request(New(), busy.Next());
  f.Request(New(), busy.Next());
  f.Request(New(), busy.Next());
  ASSERT_EQ(busy.got.size(), 3u);
  EXPECT_EQ(busy.got[2]->node, "a");
}

// A router started while etcd does not answer has no view of the fleet yet: a request waits
// for one (then is served, or refused 429 at its deadline), never 404 as an unknown model.
TEST(FleetAdmissionTest, NoModelIsUnknownBeforeTheFleetIsSeen) {
  FakeClock clock;
  FleetAdmission f(clock, {});
  Grants g;
  f.Request(New("tiny"), g.Next());
  f.Request(New("other"), g.Next());
  EXPECT_TRUE(g.got.empty()) << "both wait for the first view";
  f.SetNodes({Node("a", "tiny", 1, "127.0.2.1:1")});
  ASSERT_EQ(g.got.size(), 1u);
  EXPECT_EQ(g.got[0]->node, "a");
  clock.Advance(AdmissionOptions{}.max_queue_wait);
  f.Tick();
  ASSERT_EQ(g.got.size(), 2u);
  EXPECT_EQ(g.got[1].status().code(), StatusCode::kDeadlineExceeded)
      << "a model the fleet turned out not to serve waited, as with no primary";
  f.Request(New("other"), g.Next());
  ASSERT_EQ(g.got.size(), 3u);
  EXPECT_EQ(g.got[2].status().code(), StatusCode::kNotFound) << "once seen, unknown is unknown";
}

TEST(FleetAdmissionTest, RoutesByModelAndRefusesAModelNoNodeServes) {
  FakeClock clock;
  FleetAdmission f(clock, {});
  f.SetNodes({Node("a", "tiny", 1, "127.0.2.1:1"), Node("b", "large", 1, "127.0.2.2:1")});
  Grants g;
  f.Request(New("large"), g.Next());
  f.Request(New("tiny"), g.Next());
  f.Request(New(""), g.Next());  // no model named: any node
  f.Request(New("other"), g.Next());
  ASSERT_EQ(g.got.size(), 4u);
  EXPECT_EQ(g.got[0]->node, "b");
  EXPECT_EQ(g.got[1]->node, "a");
  EXPECT_TRUE(g.got[2].ok());
  ASSERT_FALSE(g.got[3].ok());
  EXPECT_EQ(g.got[3].status().code(), StatusCode::kNotFound);
  EXPECT_NE(g.got[3].status().message().find("other"), std::string::npos);
}

TEST(FleetAdmissionTest, AReplayLeavesTheNodeThatFailedItAndNewRequestsPassItOver) {
  FakeClock clock;
  FleetAdmission f(clock, {}, milliseconds(1000));
  f.SetNodes({Node("a", "tiny", 1, "127.0.2.1:1"), Node("b", "tiny", 1, "127.0.2.2:1")});
  Grants g;
  f.Request(New(), g.Next());
  ASSERT_TRUE(g.got[0].ok());
  const Target failed = *g.got[0];
  f.Release(failed);
  f.Request({.replay = true, .failed = failed, .model = "tiny"}, g.Next());
  ASSERT_TRUE(g.got[1].ok());
  EXPECT_NE(g.got[1]->node, failed.node);
  // New requests pass over the node the replay failed on, though it has less in flight.
  for (int i = 0; i < 3; ++i) f.Request(New(), g.Next());
  for (size_t i = 2; i < g.got.size(); ++i) EXPECT_NE(g.got[i]->node, failed.node);
  // Until the suspicion lapses.
  clock.Advance(milliseconds(1001));
  f.Request(New(), g.Next());
  EXPECT_EQ(g.got.back()->node, failed.node);
  bool suspect = true;
  for (const FleetNodeView& n : f.Nodes()) {
    if (n.name == failed.node) suspect = n.suspect;
  }
  EXPECT_FALSE(suspect);
}

TEST(FleetAdmissionTest, ALoneNodeTakesTheReplayOfItsOwnFailure) {
  FakeClock clock;
  FleetAdmission f(clock, {});
  f.SetNodes({Node("a", "tiny", 1, "127.0.2.1:1")});
  Grants g;
  f.Request(New(), g.Next());
  const Target failed = *g.got[0];
  f.Release(failed);
  // The node lists its new primary (its standby took over): the replay goes there.
  FleetNode a = Node("a", "tiny", 2, "127.0.2.1:2");
  a.routes.epoch = 2;
  f.SetNodes({a});
  f.Request({.replay = true, .failed = failed, .model = "tiny"}, g.Next());
  ASSERT_EQ(g.got.size(), 2u);
  ASSERT_TRUE(g.got[1].ok());
  EXPECT_EQ(g.got[1]->node, "a");
  EXPECT_EQ(g.got[1]->engine_id, 2u);
}

TEST(FleetAdmissionTest, ANodeThatLeavesHandsItsWaitersOnAndTellsItsWatchedAttempts) {
  FakeClock clock;
  // A ramp that holds new requests on a's new primary (one in flight at most).
  FleetAdmission f(clock, {.ramp_steps = {0.01, 1.0}, .ramp_duration = milliseconds(10000)});
  f.SetNodes({Node("a", "tiny", 1, "127.0.2.1:1")});
  Grants first;
  f.Request(New(), first.Next());
  ASSERT_TRUE(first.got[0].ok());
  int lost = 0;
  const uint64_t watch = f.WatchLoss(*first.got[0], [&] { ++lost; });
  EXPECT_NE(watch, 0u);
  FleetNode a2 = Node("a", "tiny", 2, "127.0.2.1:2");
  a2.routes.epoch = 2;
  f.SetNodes({a2});  // a failover on a: engine 2 ramps from a base of 1
  Grants g;
  f.Request(New(), g.Next());
  f.Request(New(), g.Next());
  ASSERT_EQ(g.got.size(), 1u);  // the second waits on a's ramp
  EXPECT_EQ(f.queued(), 1u);
  // b joins; a leaves: a's waiter goes to b, and the watched attempt hears it.
  f.SetNodes({Node("b", "tiny", 7, "127.0.2.2:1")});
  EXPECT_EQ(lost, 1);
  ASSERT_EQ(g.got.size(), 2u);
  ASSERT_TRUE(g.got[1].ok());
  EXPECT_EQ(g.got[1]->node, "b");
  EXPECT_EQ(g.got[1]->engine_id, 7u);
  // A watch on a node that already left is told at once.
  int late = 0;
  EXPECT_EQ(f.WatchLoss(*first.got[0], [&] { ++late; }), 0u);
  EXPECT_EQ(late, 1);
  // New requests never go to a node that left.
  for (int i = 0; i < 4; ++i) f.Request(New(), g.Next());
  for (const auto& t : g.got) EXPECT_TRUE(t.ok());
  for (size_t i = 1; i < g.got.size(); ++i) EXPECT_EQ(g.got[i]->node, "b");
}

TEST(FleetAdmissionTest, RequestsWaitWhileNoNodeHasAPrimaryAndExpire) {
  FakeClock clock;
  FleetAdmission f(clock, {.max_queue = 1, .max_queue_wait = milliseconds(500)});
  f.SetNodes({Node("a", "tiny", 1, "127.0.2.1:1", /*ready=*/false)});
  Grants g;
  f.Request(New(), g.Next());
  EXPECT_TRUE(g.got.empty());
  f.Request(New(), g.Next());  // the queue holds one
  ASSERT_EQ(g.got.size(), 1u);
  EXPECT_EQ(g.got[0].status().code(), StatusCode::kResourceExhausted);
  // a's primary is ready: the waiter goes.
  f.SetNodes({Node("a", "tiny", 1, "127.0.2.1:1")});
  ASSERT_EQ(g.got.size(), 2u);
  ASSERT_TRUE(g.got[1].ok());
  // Another waits with no node at all, and times out.
  f.SetNodes({});
  f.Request(New(), g.Next());
  clock.Advance(milliseconds(499));
  f.Tick();
  EXPECT_EQ(g.got.size(), 2u);
  clock.Advance(milliseconds(2));
  f.Tick();
  ASSERT_EQ(g.got.size(), 3u);
  EXPECT_EQ(g.got[2].status().code(), StatusCode::kDeadlineExceeded);
}

TEST(FleetAdmissionTest, ACancelledWaiterLeavesTheQueue) {
  FakeClock clock;
  FleetAdmission f(clock, {});
  Grants g;
  f.SetNodes({Node("a", "tiny", 1, "127.0.2.1:1", /*ready=*/false)});
  const uint64_t ticket = f.Request(New(), g.Next());
  f.Cancel(ticket);
  ASSERT_EQ(g.got.size(), 1u);
  EXPECT_EQ(g.got[0].status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(f.queued(), 0u);
  f.SetNodes({Node("a", "tiny", 1, "127.0.2.1:1")});
  EXPECT_EQ(g.got.size(), 1u);  // nothing granted to the cancelled one
}

TEST(FleetAdmissionTest, CanariesAreJudgedAgainstTheirOwnNodesPrimary) {
  FakeClock clock;
  FleetAdmission f(clock, {});
  FleetNode a = Node("a", "tiny", 1, "127.0.2.1:1");
  a.routes.entries.push_back({.engine_id = 3,
                              .role = proto::EngineRole::kCanary,
                              .http_address = "127.0.2.1:3",
                              .ready = true,
                              .weight = 50});
  f.SetNodes({a, Node("b", "tiny", 3, "127.0.2.2:1")});
  const Target canary{.address = "127.0.2.1:3", .engine_id = 3, .node = "a"};
  const Target b_primary{.address = "127.0.2.2:1", .engine_id = 3, .node = "b"};
  EXPECT_TRUE(f.IsCanary(canary));
  EXPECT_FALSE(f.IsCanary(b_primary));  // the same engine id on another node
  ASSERT_TRUE(f.PrimaryFor(canary).has_value());
  EXPECT_EQ(f.PrimaryFor(canary)->address, "127.0.2.1:1");
}

TEST(FleetAdmissionTest, ANewControllerOnANodeReadoptsOrFailsOver) {
  FakeClock clock;
  FleetAdmission f(clock, {});
  f.SetNodes({Node("a", "tiny", 1, "127.0.2.1:1")});
  EXPECT_EQ(f.failovers(), 0u);
  // A restarted controller that re-adopted the same primary at the same epoch: no failover.
  FleetNode again = Node("a", "tiny", 1, "127.0.2.1:1");
  again.controller_pid = 101;
  f.SetNodes({again});
  EXPECT_EQ(f.failovers(), 0u);
  // One that started new engines (a new epoch, same id and address): a failover.
  FleetNode fresh = Node("a", "tiny", 1, "127.0.2.1:1");
  fresh.controller_pid = 102;
  fresh.routes.epoch = 2;
  f.SetNodes({fresh});
  EXPECT_EQ(f.failovers(), 1u);
}

// A node that left is forgotten once it stayed away for the retention and nothing of it is
// left: not while listed, not before the retention, not while a request is in flight there;
// its failovers stay counted, and a request for the model only it served is then unknown.
TEST(FleetAdmissionTest, ANodeThatStaysAwayIsForgottenOnceNothingOfItIsLeft) {
  FakeClock clock;
  FleetAdmission f(clock, {});
  const milliseconds retention(60000);
  f.SetNodes({Node("a", "tiny", 1, "127.0.2.1:1"), Node("b", "big", 1, "127.0.2.2:1")});
  FleetNode b2 = Node("b", "big", 2, "127.0.2.2:2");
  b2.routes.epoch = 2;
  f.SetNodes({Node("a", "tiny", 1, "127.0.2.1:1"), b2});  // a failover on b
  EXPECT_EQ(f.failovers(), 1u);
  Grants g;
  f.Request(New("big"), g.Next());
  ASSERT_EQ(g.got.size(), 1u);
  ASSERT_TRUE(g.got[0].ok());
  clock.Advance(retention * 2);
  EXPECT_EQ(f.Forget(clock.Now(), retention), 0u) << "both are listed";
  f.SetNodes({Node("a", "tiny", 1, "127.0.2.1:1")});  // b leaves with a request in flight
  clock.Advance(retention - milliseconds(1));
  EXPECT_EQ(f.Forget(clock.Now(), retention), 0u) << "not away long enough";
  clock.Advance(milliseconds(1));
  EXPECT_EQ(f.Forget(clock.Now(), retention), 0u) << "a request is still in flight there";
  EXPECT_EQ(f.Nodes().size(), 2u);
  f.Release(*g.got[0]);
  EXPECT_EQ(f.Forget(clock.Now(), retention), 1u);
  ASSERT_EQ(f.Nodes().size(), 1u);
  EXPECT_EQ(f.Nodes()[0].name, "a");
  EXPECT_EQ(f.failovers(), 1u) << "b's failover stays counted";
  f.Request(New("big"), g.Next());
  ASSERT_EQ(g.got.size(), 2u);
  EXPECT_EQ(g.got[1].status().code(), StatusCode::kNotFound);
  // Listed again, it takes requests again.
  f.SetNodes({Node("a", "tiny", 1, "127.0.2.1:1"), Node("b", "big", 3, "127.0.2.2:3")});
  f.Request(New("big"), g.Next());
  ASSERT_EQ(g.got.size(), 3u);
  ASSERT_TRUE(g.got[2].ok());
  EXPECT_EQ(g.got[2]->engine_id, 3u);
}

// A node that left is not forgotten while a ticket still names it, even with nothing in flight
// or queued there: its admission's waiters, handed back when it left, are on their way to
// another node one after another, and a Forget() that runs meanwhile (here from the grant of
// the first, as the router's timer could) would leave the next one nowhere to go. Once every
// ticket is gone and the retention passed, it is forgotten.
TEST(FleetAdmissionTest, ANodeIsNotForgottenWhileATicketStillNamesIt) {
  FakeClock clock;
  FleetAdmission f(clock, {});
  const milliseconds retention(60000);
  f.SetNodes({Node("b", "tiny", 1, "127.0.2.2:1")});
  // b's primary refuses connections: two requests wait in b's own queue, none in flight.
  f.Unreachable({.address = "127.0.2.2:1", .engine_id = 1, .node = "b"});
  Grants g;
  size_t forgotten_meanwhile = 0;
  f.Request(New(), [&](Result<Target> t) {
    forgotten_meanwhile += f.Forget(clock.Now() + retention, retention);
    g.got.push_back(std::move(t));
  });
  f.Request(New(), g.Next());
  EXPECT_TRUE(g.got.empty());
  // b leaves and a joins: b's waiters go to a, the first one's grant running before the
  // second is dispatched again.
  f.SetNodes({Node("a", "tiny", 1, "127.0.2.1:1")});
  EXPECT_EQ(forgotten_meanwhile, 0u) << "the second waiter's ticket still names b";
  ASSERT_EQ(g.got.size(), 2u);
  for (const Result<Target>& t : g.got) {
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    EXPECT_EQ(t->node, "a");
  }
  ASSERT_EQ(f.Nodes().size(), 2u);
  // Nothing of b is left: forgotten once the retention passed, not before.
  EXPECT_EQ(f.Forget(clock.Now() + retention - milliseconds(1), retention), 0u);
  EXPECT_EQ(f.Forget(clock.Now() + retention, retention), 1u);
  ASSERT_EQ(f.Nodes().size(), 1u);
  EXPECT_EQ(f.Nodes()[0].name, "a");
}

}  // namespace
}  // namespace baton
