// Admission with the fake clock when the operator takes the pair out of service (`batonctl
// drain`: pair state `draining`, then `stopped`): requests that find no engine are refused at
// once with FailedPrecondition (the router answers 503) instead of waiting out the queue,
// the waiters queued when such a table arrives too, a replay too; a pair without a primary
// for any other reason (down, failing over, stopping) still queues; a resumed pair serves.
#include <gtest/gtest.h>

#include "router/admission.h"

namespace baton {
namespace {

using std::chrono::milliseconds;

proto::RouteTable Table(const std::string& pair_state, std::vector<proto::RouteEntry> entries) {
  static uint64_t version = 0;
  proto::RouteTable t;
  t.version = ++version;
  t.epoch = 1;
  t.pair_state = pair_state;
  t.entries = std::move(entries);
  return t;
}

proto::RouteEntry Entry(uint64_t id, proto::EngineRole role, bool ready = true) {
  return {.engine_id = id,
          .role = role,
          .http_address = "127.0.0.1:" + std::to_string(id),
          .ready = ready};
}

proto::RouteEntry Primary(uint64_t id) { return Entry(id, proto::EngineRole::kPrimary); }

// What the controller publishes while the primary finishes its requests after `batonctl
// drain`: the primary listed as draining (the standby is already gone).
proto::RouteTable Draining(uint64_t primary) {
  return Table("draining", {Entry(primary, proto::EngineRole::kDraining)});
}

struct Grants {
  std::vector<Result<Target>> got;
  Admission::Grant Next() {
    return [this](Result<Target> t) { got.push_back(std::move(t)); };
  }
};

TEST(AdmissionOutOfServiceTest, OnlyDrainingAndStoppedAreOutOfService) {
  for (const char* state : {"draining", "stopped"}) {
    EXPECT_TRUE(IsOutOfService(Table(state, {}))) << state;
  }
  for (const char* state : {"ready", "degraded", "down", "down_backoff", "failing_over",
                            "switching_over", "recovering", "starting", "stopping", "static", ""}) {
    EXPECT_FALSE(IsOutOfService(Table(state, {}))) << state;
  }
}

TEST(AdmissionOutOfServiceTest, ANewRequestToAStoppedPairIsRefusedAtOnce) {
  FakeClock clock;
  Admission a(clock, {.max_queue_wait = milliseconds(5000)});
  a.SetTable(Table("stopped", {}));
  EXPECT_TRUE(a.OutOfService());
  Grants g;
  a.Request(false, std::nullopt, g.Next());
  ASSERT_EQ(g.got.size(), 1u);  // no time passed: not the queue's deadline
  EXPECT_EQ(g.got[0].status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(g.got[0].status().message().find("out of service"), std::string::npos);
  EXPECT_NE(g.got[0].status().message().find("batonctl resume"), std::string::npos);
  EXPECT_EQ(a.queued(), 0u);
}

TEST(AdmissionOutOfServiceTest, TheWaitersAreRefusedWhenTheStoppedTableArrives) {
  FakeClock clock;
  Admission a(clock, {.max_queue_wait = milliseconds(5000)});
  a.SetTable(Table("down", {}));  // no primary: requests wait for one
  Grants waiting;
  a.Request(false, std::nullopt, waiting.Next());
  a.Request(false, std::nullopt, waiting.Next());
  EXPECT_EQ(a.queued(), 2u);
  clock.Advance(milliseconds(100));
  a.SetTable(Table("stopped", {}));  // `batonctl drain` of a pair that is down
  ASSERT_EQ(waiting.got.size(), 2u);
  for (const auto& r : waiting.got) EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(a.queued(), 0u);
}

// A drain while the new primary ramps up: the requests held back by the ramp are refused when
// the draining table arrives; those in flight on the draining primary finish there.
TEST(AdmissionOutOfServiceTest, TheWaitersAreRefusedWhenTheDrainingTableArrives) {
  FakeClock clock;
  Admission a(clock, {.max_queue_wait = milliseconds(5000)});
  a.SetTable(Table("ready", {Primary(1)}));
  Grants before;
  for (int i = 0; i < 4; ++i) a.Request(false, std::nullopt, before.Next());
  a.SetTable(Table("ready", {Primary(2)}));  // a failover: the ramp caps engine 2 at 2 of 4
  for (const auto& t : before.got) a.Release(*t);
  Grants ramped;
  for (int i = 0; i < 4; ++i) a.Request(false, std::nullopt, ramped.Next());
  ASSERT_EQ(ramped.got.size(), 2u);
  EXPECT_EQ(a.queued(), 2u);
  clock.Advance(milliseconds(100));
  a.SetTable(Draining(2));
  ASSERT_EQ(ramped.got.size(), 4u);
  EXPECT_EQ(ramped.got[2].status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(ramped.got[3].status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(a.queued(), 0u);
  EXPECT_EQ(a.in_flight(), 2u);  // untouched: the draining primary finishes them
  a.Release(*ramped.got[0]);
  a.Release(*ramped.got[1]);
  EXPECT_EQ(a.in_flight(), 0u);
}

// The draining primary died before it finished: no failover follows a drain, so the replay
// is refused at once as well.
TEST(AdmissionOutOfServiceTest, AReplayDuringADrainIsRefusedAtOnce) {
  FakeClock clock;
  Admission a(clock, {});
  a.SetTable(Table("ready", {Primary(1)}));
  Grants first;
  a.Request(false, std::nullopt, first.Next());
  ASSERT_TRUE(first.got.at(0).ok());
  a.SetTable(Draining(1));
  a.Release(*first.got[0]);
  Grants replay;
  a.Request(true, *first.got[0], replay.Next());
  ASSERT_EQ(replay.got.size(), 1u);
  EXPECT_EQ(replay.got[0].status().code(), StatusCode::kFailedPrecondition);
}

TEST(AdmissionOutOfServiceTest, APairWithoutAPrimaryForAnotherReasonStillQueues) {
  for (const char* state : {"failing_over", "down", "down_backoff", "recovering", "stopping"}) {
    FakeClock clock;
    Admission a(clock, {.max_queue_wait = milliseconds(5000)});
    a.SetTable(Table(state, {Entry(2, proto::EngineRole::kPromoting, /*ready=*/false)}));
    EXPECT_FALSE(a.OutOfService()) << state;
    Grants g;
    a.Request(false, std::nullopt, g.Next());
    a.Request(true, std::nullopt, g.Next());
    EXPECT_TRUE(g.got.empty()) << state;
    EXPECT_EQ(a.queued(), 2u) << state;
    // A primary comes: both go there.
    a.SetTable(Table("ready", {Primary(2)}));
    ASSERT_EQ(g.got.size(), 2u) << state;
    EXPECT_TRUE(g.got[0].ok() && g.got[1].ok()) << state;
  }
}

TEST(AdmissionOutOfServiceTest, AResumedPairAdmitsAgain) {
  FakeClock clock;
  Admission a(clock, {});
  a.SetTable(Table("stopped", {}));
  Grants refused;
  a.Request(false, std::nullopt, refused.Next());
  ASSERT_EQ(refused.got.size(), 1u);
  EXPECT_FALSE(refused.got[0].ok());
  // `batonctl resume` on a stopped pair: a new pair is launched (`down`), its requests wait...
  a.SetTable(Table("down", {}));
  EXPECT_FALSE(a.OutOfService());
  Grants g;
  a.Request(false, std::nullopt, g.Next());
  EXPECT_TRUE(g.got.empty());
  EXPECT_EQ(a.queued(), 1u);
  // ...until its primary is ready.
  a.SetTable(Table("ready", {Primary(3)}));
  ASSERT_EQ(g.got.size(), 1u);
  ASSERT_TRUE(g.got[0].ok());
  EXPECT_EQ(g.got[0]->engine_id, 3u);
}

// An evicted route (a fleet node that left) is no longer out of service: it has no table.
TEST(AdmissionOutOfServiceTest, EvictForgetsTheDrain) {
  FakeClock clock;
  Admission a(clock, {});
  a.SetTable(Table("stopped", {}));
  a.Evict();
  EXPECT_FALSE(a.OutOfService());
  Grants g;
  a.Request(false, std::nullopt, g.Next());
  EXPECT_TRUE(g.got.empty());
  EXPECT_EQ(a.queued(), 1u);
}

}  // namespace
}  // namespace baton
