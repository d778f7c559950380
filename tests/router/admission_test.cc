// Admission with the fake clock: the queue and its 429s, the ramp onto a new primary,
// weighted picking, and replays that skip the queue and avoid the engine that failed.
#include "controller/router/admission.h"

#include <gtest/gtest.h>

#include <map>

namespace baton {
namespace {

using std::chrono::milliseconds;

proto::RouteTable Table(std::vector<proto::RouteEntry> entries) {
  static uint64_t version = 0;
  proto::RouteTable t;
  t.version = ++version;
  t.entries = std::move(entries);
  return t;
}

proto::RouteEntry Primary(uint64_t id, const std::string& address) {
  return {.engine_id = id, .role = "primary", .http_address = address, .ready = true};
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
  EXPECT_FALSE(g.got[1].ok());
  EXPECT_FALSE(g.got[2].ok());
  EXPECT_EQ(a.queued(), 0u);
  EXPECT_EQ(a.RetryAfterSeconds(), 5);
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

TEST(AdmissionTest, WeightsSplitTrafficSmoothly) {
  FakeClock clock;
  Admission a(clock, {});
  proto::RouteEntry canary{
      .engine_id = 2, .role = "canary", .http_address = "127.0.0.1:2", .ready = true, .weight = 25};
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

}  // namespace
}  // namespace baton
