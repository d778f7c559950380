// Admission with the fake clock: the queue and its 429s, the ramp onto a new primary,
// weighted picking, canary weights, and replays that skip the queue and avoid the engine
// that failed.
#include "router/admission.h"

#include <gtest/gtest.h>

#include <map>

namespace baton {
namespace {

using std::chrono::milliseconds;

proto::RouteTable Table(std::vector<proto::RouteEntry> entries, uint64_t epoch = 1) {
  static uint64_t version = 0;
  proto::RouteTable t;
  t.version = ++version;
  t.epoch = epoch;
  t.entries = std::move(entries);
  return t;
}

proto::RouteEntry Primary(uint64_t id, const std::string& address) {
  return {
      .engine_id = id, .role = proto::EngineRole::kPrimary, .http_address = address, .ready = true};
}

// Records each grant.
struct Grants {
  std::vector<Result<Target>> got;
  Admission::Grant Next() {
    return [this](Result<Target> t) { got.push_back(std::move(t)); };
  }
  size_t ok() const {
    size_t n = 0;
    for (const auto& g : got) n += g.ok() ? 1 : 0;
    return n;
  }
};

TEST(AdmissionTest, GrantsAtOnceWithAPrimary) {
  FakeClock clock;
  Admission a(clock, {});
  a.SetTable(Table({Primary(1, "127.0.0.1:1")}));
  Grants g;
  a.Request(false, std::nullopt, g.Next());
  ASSERT_EQ(g.got.size(), 1u);
  ASSERT_TRUE(g.got[0].ok());
  EXPECT_EQ(g.got[0]->address, "127.0.0.1:1");
  EXPECT_EQ(a.in_flight(), 1u);
  a.Release(*g.got[0]);
  EXPECT_EQ(a.in_flight(), 0u);
}

TEST(AdmissionTest, QueuesWithoutPrimaryThenRefusesPastTheWait) {
  FakeClock clock;
  Admission a(clock, {.max_queue = 2, .max_queue_wait = milliseconds(5000)});
  Grants g;
  a.Request(false, std::nullopt, g.Next());
  a.Request(false, std::nullopt, g.Next());
  EXPECT_EQ(a.queued(), 2u);
  a.Request(false, std::nullopt, g.Next());  // the queue is full
  ASSERT_EQ(g.got.size(), 1u);
  EXPECT_EQ(g.got[0].status().code(), StatusCode::kResourceExhausted);
  clock.Advance(milliseconds(4999));
  a.Tick();
  EXPECT_EQ(g.got.size(), 1u);
  clock.Advance(milliseconds(1));
  a.Tick();
  ASSERT_EQ(g.got.size(), 3u);
  EXPECT_EQ(g.got[1].status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(g.got[2].status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(a.queued(), 0u);
  EXPECT_EQ(a.RetryAfterSeconds(), 5);
}

// max_queue bounds the requests that wait, not the ones that can go at once: with no room
// to queue, a ready primary still takes new requests.
TEST(AdmissionTest, ARequestThatCanGoNowIsNeverRefusedForAFullQueue) {
  FakeClock clock;
  Admission a(clock, {.max_queue = 0});
  a.SetTable(Table({Primary(1, "127.0.0.1:1")}));
  Grants g;
  a.Request(false, std::nullopt, g.Next());
  a.Request(false, std::nullopt, g.Next());
  EXPECT_EQ(g.ok(), 2u);
  Admission none(clock, {.max_queue = 0});
  Grants refused;
  none.Request(false, std::nullopt, refused.Next());
  ASSERT_EQ(refused.got.size(), 1u);
  EXPECT_EQ(refused.got[0].status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(none.queued(), 0u);
}

// A waiter whose client went away gives its place up at once: the next client queues
// instead of getting 429, and the cancelled grant is called once, with an error.
TEST(AdmissionTest, ACancelledWaiterLeavesTheQueueAtOnce) {
  FakeClock clock;
  Admission a(clock, {.max_queue = 1, .max_queue_wait = milliseconds(5000)});
  Grants gone, next;
  const uint64_t ticket = a.Request(false, std::nullopt, gone.Next());
  EXPECT_EQ(a.queued(), 1u);
  a.Cancel(ticket);
  ASSERT_EQ(gone.got.size(), 1u);
  EXPECT_EQ(gone.got[0].status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(a.queued(), 0u);
  a.Request(false, std::nullopt, next.Next());
  EXPECT_TRUE(next.got.empty()) << "queued, not refused";
  a.Cancel(ticket);  // no longer waiting: nothing happens
  EXPECT_EQ(gone.got.size(), 1u);
  a.SetTable(Table({Primary(1, "127.0.0.1:1")}));
  EXPECT_EQ(next.ok(), 1u);
}

// A restarted controller starts engine 1 on the same fixed port again: a new, cold engine,
// which ramps up like any new primary.
TEST(AdmissionTest, ThePrimaryOfARestartedControllerRampsUpThoughItsAddressIsTheSame) {
  FakeClock clock;
  Admission a(clock, {.ramp_steps = {0.5, 1.0}, .ramp_duration = milliseconds(1000)});
  a.SetTable(Table({Primary(1, "127.0.0.1:8101")}));
  a.SetTable(Table({}));
  a.SetTable(Table({Primary(1, "127.0.0.1:8101")}));
  EXPECT_EQ(a.failovers(), 0u) << "the same engine, listed again";
  a.ControllerRestarted();
  a.SetTable(Table({}));
  a.SetTable(Table({Primary(1, "127.0.0.1:8101")}, /*epoch=*/5));
  EXPECT_EQ(a.failovers(), 1u) << "another epoch: a new engine";
  ASSERT_EQ(a.Weights().size(), 1u);
  EXPECT_DOUBLE_EQ(a.Weights()[0].weight, 50.0) << "ramping";
  a.SetTable(Table({Primary(1, "127.0.0.1:8101")}, 5));
  EXPECT_EQ(a.failovers(), 1u) << "counted once";
}

// A restarted controller that re-adopted its primary lists the same engine at the same
// epoch: it is not a failover, and the primary keeps its whole share at once.
TEST(AdmissionTest, APrimaryReadoptedByARestartedControllerIsNoFailover) {
  FakeClock clock;
  Admission a(clock, {.ramp_steps = {0.5, 1.0}, .ramp_duration = milliseconds(1000)});
  a.SetTable(Table({Primary(3, "127.0.0.1:8101")}, 7));
  a.ControllerRestarted();
  a.SetTable(Table({Primary(3, "127.0.0.1:8101")}, 7));
  EXPECT_EQ(a.failovers(), 0u);
  ASSERT_EQ(a.Weights().size(), 1u);
  EXPECT_DOUBLE_EQ(a.Weights()[0].weight, 100.0) << "no ramp";
}

TEST(AdmissionTest, QueueDrainsInOrderWhenAPrimaryAppears) {
  FakeClock clock;
  Admission a(clock, {});
  std::vector<int> order;
  for (int i = 0; i < 3; ++i) {
    a.Request(false, std::nullopt, [&order, i](Result<Target> t) {
      if (t.ok()) order.push_back(i);
    });
  }
  EXPECT_TRUE(order.empty());
  a.SetTable(Table({Primary(1, "127.0.0.1:1")}));
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2}));
}

TEST(AdmissionTest, RampCapsTheNewPrimaryInSteps) {
  FakeClock clock;
  Admission a(clock, {.ramp_steps = {0.3, 0.6, 1.0}, .ramp_duration = milliseconds(3000)});
  a.SetTable(Table({Primary(1, "127.0.0.1:1")}));
  Grants before;
  for (int i = 0; i < 10; ++i) a.Request(false, std::nullopt, before.Next());
  ASSERT_EQ(before.ok(), 10u);  // peak concurrency 10
  for (const auto& t : before.got) a.Release(*t);
  a.SetTable(Table({Primary(2, "127.0.0.1:2")}));  // a promotion
  EXPECT_EQ(a.failovers(), 1u);
  Grants after;
  for (int i = 0; i < 10; ++i) a.Request(false, std::nullopt, after.Next());
  EXPECT_EQ(after.ok(), 3u);  // 30 % of 10
  EXPECT_EQ(a.queued(), 7u);
  clock.Advance(milliseconds(1000));
  a.Tick();
  EXPECT_EQ(after.ok(), 6u);  // 60 %
  a.Release(*after.got[0]);   // a request ends: one more may go
  EXPECT_EQ(after.ok(), 7u);
  clock.Advance(milliseconds(2000));
  a.Tick();
  EXPECT_EQ(after.ok(), 10u);  // 100 %: the queue drained
  EXPECT_EQ(a.queued(), 0u);
}

TEST(AdmissionTest, ReplaysSkipTheRampAndTheQueue) {
  FakeClock clock;
  Admission a(clock, {.ramp_duration = milliseconds(3000)});
  a.SetTable(Table({Primary(1, "127.0.0.1:1")}));
  Grants g;
  for (int i = 0; i < 4; ++i) a.Request(false, std::nullopt, g.Next());
  for (const auto& t : g.got) a.Release(*t);
  a.SetTable(Table({Primary(2, "127.0.0.1:2")}));
  Grants fresh;
  for (int i = 0; i < 4; ++i) a.Request(false, std::nullopt, fresh.Next());
  EXPECT_LT(fresh.ok(), 4u);
  Grants replay;
  a.Request(true, Target{"127.0.0.1:1", 1}, replay.Next());
  ASSERT_EQ(replay.got.size(), 1u);
  EXPECT_EQ(replay.got[0]->address, "127.0.0.1:2");
}

TEST(AdmissionTest, ReplayAvoidsTheFailedEngineUntilTheTableChanges) {
  FakeClock clock;
  Admission a(clock, {.retry_same_after = milliseconds(250)});
  a.SetTable(Table({Primary(1, "127.0.0.1:1")}));
  Grants g;
  a.Request(true, Target{"127.0.0.1:1", 1}, g.Next());
  EXPECT_TRUE(g.got.empty());  // the dead primary is still listed: wait
  a.SetTable(Table({}));       // fenced
  EXPECT_TRUE(g.got.empty());
  a.SetTable(Table({Primary(2, "127.0.0.1:2")}));
  ASSERT_EQ(g.got.size(), 1u);
  EXPECT_EQ(g.got[0]->engine_id, 2u);

  Grants same;  // a static backend that stays listed: tried again after retry_same_after
  a.Request(true, Target{"127.0.0.1:2", 2}, same.Next());
  EXPECT_TRUE(same.got.empty());
  clock.Advance(milliseconds(250));
  a.Tick();
  ASSERT_EQ(same.got.size(), 1u);
  EXPECT_EQ(same.got[0]->engine_id, 2u);
}

// A primary that refused a connection (a dead one still listed while the controller hangs)
// gets no request, new or replayed, until the route changes; after retry_same_after one
// request probes it again; past max_queue_wait the waiters get 429.
TEST(AdmissionTest, AnAddressThatRefusedGetsNoRequestUntilTheRouteChanges) {
  FakeClock clock;
  Admission a(clock, {.max_queue_wait = milliseconds(5000), .retry_same_after = milliseconds(250)});
  a.SetTable(Table({Primary(1, "127.0.0.1:1")}));
  a.Unreachable(Target{"127.0.0.1:1", 1});
  Grants g;
  a.Request(false, std::nullopt, g.Next());
  a.Request(true, Target{"127.0.0.1:1", 1}, g.Next());
  EXPECT_TRUE(g.got.empty()) << "a request went to an address that refuses connections";
  EXPECT_EQ(a.queued(), 2u);
  clock.Advance(milliseconds(249));
  a.Tick();
  EXPECT_TRUE(g.got.empty());
  clock.Advance(milliseconds(1));
  a.Tick();  // a probe: the replay first (ahead of the queue), then the new request
  ASSERT_EQ(g.got.size(), 2u);
  EXPECT_EQ(g.got[0]->address, "127.0.0.1:1");
  a.Release(*g.got[0]);
  a.Release(*g.got[1]);

  a.Unreachable(Target{"127.0.0.1:1", 1});  // refused again
  Grants held;
  a.Request(false, std::nullopt, held.Next());
  EXPECT_TRUE(held.got.empty());
  a.SetTable(Table({Primary(2, "127.0.0.1:2")}));  // the standby promoted
  ASSERT_EQ(held.got.size(), 1u);
  EXPECT_EQ(held.got[0]->address, "127.0.0.1:2");

  Grants late;  // no engine that listens, for the whole queue wait: 429
  a.Unreachable(Target{"127.0.0.1:2", 2});
  a.Request(false, std::nullopt, late.Next());
  for (int i = 0; i < 25 && late.got.empty(); ++i) {
    clock.Advance(milliseconds(249));  // each probe is refused again before it can go
    a.Unreachable(Target{"127.0.0.1:2", 2});
    a.Tick();
  }
  ASSERT_EQ(late.got.size(), 1u);
  EXPECT_EQ(late.got[0].status().code(), StatusCode::kDeadlineExceeded);

  a.Unreachable(Target{"127.0.0.1:9", 9});  // not listed: nothing to mark
  Grants fine;
  a.Request(false, std::nullopt, fine.Next());
  EXPECT_TRUE(fine.got.empty());  // 127.0.0.1:2 is still marked
}

TEST(AdmissionTest, WeightsSplitTrafficSmoothly) {
  FakeClock clock;
  Admission a(clock, {});
  proto::RouteEntry canary{.engine_id = 2,
                           .role = proto::EngineRole::kCanary,
                           .http_address = "127.0.0.1:2",
                           .ready = true,
                           .weight = 25};
  proto::RouteEntry primary = Primary(1, "127.0.0.1:1");
  primary.weight = 75;
  a.SetTable(Table({primary, canary}));
  std::map<uint64_t, int> count;
  for (int i = 0; i < 100; ++i) {
    a.Request(false, std::nullopt, [&](Result<Target> t) {
      ASSERT_TRUE(t.ok());
      ++count[t->engine_id];
      a.Release(*t);
    });
  }
  EXPECT_EQ(count[1], 75);
  EXPECT_EQ(count[2], 25);
  std::vector<TargetWeight> w = a.Weights();
  ASSERT_EQ(w.size(), 2u);
  EXPECT_DOUBLE_EQ(w[0].weight + w[1].weight, 100.0);
}

proto::RouteEntry Canary(uint64_t id, const std::string& address, uint32_t weight) {
  return {.engine_id = id,
          .role = proto::EngineRole::kCanary,
          .http_address = address,
          .ready = true,
          .weight = weight,
          .engine_version = "new"};
}

// Grants `n` new requests, each released at once; counts them by engine id.
std::map<uint64_t, int> Spread(Admission& a, int n) {
  std::map<uint64_t, int> count;
  for (int i = 0; i < n; ++i) {
    a.Request(false, std::nullopt, [&](Result<Target> t) {
      ASSERT_TRUE(t.ok()) << t.status().ToString();
      ++count[t->engine_id];
      a.Release(*t);
    });
  }
  return count;
}

TEST(AdmissionTest, CanaryWeightsSplitExactly) {
  FakeClock clock;
  Admission a(clock, {});
  proto::RouteEntry primary = Primary(1, "127.0.0.1:1");
  primary.weight = 90;
  a.SetTable(Table({primary, Canary(2, "127.0.0.1:2", 10)}));
  std::map<uint64_t, int> count = Spread(a, 100);
  EXPECT_EQ(count[1], 90);
  EXPECT_EQ(count[2], 10);

  primary.weight = 50;  // the canary's next step
  a.SetTable(Table({primary, Canary(2, "127.0.0.1:2", 50)}));
  count = Spread(a, 100);
  EXPECT_EQ(count[1], 50);
  EXPECT_EQ(count[2], 50);
  EXPECT_EQ(a.failovers(), 0u);
}

TEST(AdmissionTest, WeightlessPrimaryCountsAsFullOnlyWithoutAWeightedCanary) {
  FakeClock clock;
  Admission a(clock, {});
  // No canary, or one with weight 0: the primary's weight 0 reads as 100.
  a.SetTable(Table({Primary(1, "127.0.0.1:1"), Canary(2, "127.0.0.1:2", 0)}));
  std::map<uint64_t, int> count = Spread(a, 10);
  EXPECT_EQ(count[1], 10);
  EXPECT_EQ(count[2], 0);
}

TEST(AdmissionTest, PrimaryGetsNoNewRequestsWithACanaryAtFull) {
  FakeClock clock;
  Admission a(clock, {});
  a.SetTable(Table({Primary(1, "127.0.0.1:1"), Canary(2, "127.0.0.1:2", 100)}));
  std::map<uint64_t, int> count = Spread(a, 50);
  EXPECT_EQ(count[1], 0);
  EXPECT_EQ(count[2], 50);
  std::vector<TargetWeight> w = a.Weights();
  ASSERT_EQ(w.size(), 2u);
  for (const TargetWeight& t : w) {
    EXPECT_DOUBLE_EQ(t.weight, t.target.engine_id == 1 ? 0.0 : 100.0);
    EXPECT_EQ(t.role,
              t.target.engine_id == 1 ? proto::EngineRole::kPrimary : proto::EngineRole::kCanary);
  }

  // A replay that failed on the canary may still go to the primary, the only other target.
  Grants replay;
  a.Request(true, Target{"127.0.0.1:2", 2}, replay.Next());
  ASSERT_EQ(replay.got.size(), 1u);
  ASSERT_TRUE(replay.got[0].ok());
  EXPECT_EQ(replay.got[0]->engine_id, 1u);
  // A replay from elsewhere goes by the weights: to the canary.
  Grants other;
  a.Request(true, Target{"127.0.0.1:9", 9}, other.Next());
  ASSERT_EQ(other.got.size(), 1u);
  ASSERT_TRUE(other.got[0].ok());
  EXPECT_EQ(other.got[0]->engine_id, 2u);
}

TEST(AdmissionTest, NoRampWhenAWeightedCanaryBecomesThePrimary) {
  FakeClock clock;
  Admission a(clock, {.ramp_steps = {0.3, 0.6, 1.0}, .ramp_duration = milliseconds(3000)});
  a.SetTable(Table({Primary(1, "127.0.0.1:1"), Canary(2, "127.0.0.1:2", 100)}));
  Grants before;
  for (int i = 0; i < 10; ++i) a.Request(false, std::nullopt, before.Next());
  ASSERT_EQ(before.ok(), 10u);  // peak concurrency 10, all on the canary
  for (const auto& t : before.got) a.Release(*t);
  a.SetTable(Table({Primary(2, "127.0.0.1:2")}));  // the canary takes over
  Grants after;
  for (int i = 0; i < 10; ++i) a.Request(false, std::nullopt, after.Next());
  EXPECT_EQ(after.ok(), 10u);  // no 30 % cap
  EXPECT_EQ(a.queued(), 0u);
  for (const TargetWeight& t : a.Weights()) EXPECT_DOUBLE_EQ(t.weight, 100.0);
}

TEST(AdmissionTest, RampWhenTheNewPrimaryWasNotAWeightedCanary) {
  FakeClock clock;
  Admission a(clock, {.ramp_steps = {0.3, 0.6, 1.0}, .ramp_duration = milliseconds(3000)});
  a.SetTable(Table({Primary(1, "127.0.0.1:1"), Canary(2, "127.0.0.1:2", 0)}));
  Grants before;
  for (int i = 0; i < 10; ++i) a.Request(false, std::nullopt, before.Next());
  ASSERT_EQ(before.ok(), 10u);
  for (const auto& t : before.got) a.Release(*t);
  a.SetTable(Table({Primary(2, "127.0.0.1:2")}));  // a canary at weight 0 carried nothing
  Grants after;
  for (int i = 0; i < 10; ++i) a.Request(false, std::nullopt, after.Next());
  EXPECT_EQ(after.ok(), 3u);
}

// A canary stays one while it drains after a rollback (its late 5xx are retried elsewhere),
// and stops being one when it becomes the primary or leaves the table.
TEST(AdmissionTest, ACanaryStaysOneUntilPrimaryOrGone) {
  FakeClock clock;
  Admission a(clock, {});
  const Target canary{"127.0.0.1:2", 2};
  EXPECT_FALSE(a.IsCanary(canary));
  a.SetTable(Table({Primary(1, "127.0.0.1:1"), Canary(2, "127.0.0.1:2", 10)}));
  EXPECT_TRUE(a.IsCanary(canary));
  EXPECT_FALSE(a.IsCanary({"127.0.0.1:1", 1}));
  proto::RouteEntry primary = Primary(1, "127.0.0.1:1");
  primary.weight = 90;
  a.SetTable(Table({primary, Canary(2, "127.0.0.1:2", 10)}));
  Grants picked;  // a pick says what it was picked as: the table may change before the answer
  for (int i = 0; i < 10; ++i) a.Request(false, std::nullopt, picked.Next());
  ASSERT_EQ(picked.ok(), 10u);
  size_t canaries = 0;
  for (const auto& t : picked.got) {
    EXPECT_EQ(t->canary, t->engine_id == 2) << t->address;
    canaries += t->canary ? 1 : 0;
    a.Release(*t);
  }
  EXPECT_EQ(canaries, 1u);
  proto::RouteEntry draining = Canary(2, "127.0.0.1:2", 0);
  draining.role = proto::EngineRole::kDraining;
  draining.ready = false;
  a.SetTable(Table({Primary(1, "127.0.0.1:1"), draining}));  // rolled back
  EXPECT_TRUE(a.IsCanary(canary));
  a.SetTable(Table({Primary(1, "127.0.0.1:1")}));  // reaped
  EXPECT_FALSE(a.IsCanary(canary));
  a.SetTable(Table({Primary(1, "127.0.0.1:1"), Canary(2, "127.0.0.1:2", 100)}));
  a.SetTable(Table({Primary(2, "127.0.0.1:2")}));  // took over
  EXPECT_FALSE(a.IsCanary(canary));
}

}  // namespace
}  // namespace baton
