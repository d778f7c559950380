#include "controller/core/promotion.h"

#include <gtest/gtest.h>

namespace baton {
namespace {

using std::chrono::milliseconds;

TEST(Timeline, PhasesFromStamps) {
  FakeClock clock;
  TimelineLog log(clock, 2);
  PromotionRecord& r = log.Open(PromotionKind::kFailover, "hung: silent");
  const TimePoint t0 = clock.Now();
  r.last_heartbeat = t0;
  r.detected = t0 + milliseconds(400);
  r.killed = t0 + milliseconds(401);
  r.epoch_durable = t0 + milliseconds(405);
  r.reaped = t0 + milliseconds(406);
  r.promote_sent = t0 + milliseconds(406);
  r.promote_acked = t0 + milliseconds(420);
  r.route_published = t0 + milliseconds(421);
  const PhaseTimes p = PhasesOf(r);
  EXPECT_DOUBLE_EQ(*p.detect_ms, 400);
  EXPECT_DOUBLE_EQ(*p.fence_ms, 6);
  EXPECT_DOUBLE_EQ(*p.promote_ms, 14);
  EXPECT_DOUBLE_EQ(*p.ready_ms, 21);
  EXPECT_DOUBLE_EQ(*p.total_ms, 421);
  nlohmann::json j = TimelineJson(r, clock.Now());
  EXPECT_EQ(j["kind"], "failover");
  EXPECT_DOUBLE_EQ(j["stamps"]["reaped_ms"].get<double>(), 406);
  EXPECT_DOUBLE_EQ(j["phases"]["fence_ms"].get<double>(), 6);
  EXPECT_FALSE(j["stamps"].contains("injected_ms"));
  EXPECT_NE(TimelineText(r, clock.Now()).find("reaped"), std::string::npos);
  EXPECT_NE(TimelineLog::Summary(r).find("fence 6.00 ms"), std::string::npos);
}

// A promotion that did not wait for the barrier is "before" it only when Promote went out
// first: a standby still starting may be promoted after a barrier that passed meanwhile.
TEST(Timeline, BeforeTheBarrierOnlyWhenPromoteWentOutFirst) {
  FakeClock clock;
  TimelineLog log(clock);
  PromotionRecord& r = log.Open(PromotionKind::kFailover, "died");
  const TimePoint t0 = clock.Now();
  r.detected = t0;
  r.promote_sent = t0 + milliseconds(1);
  r.barrier_passed = t0 + milliseconds(30);
  EXPECT_TRUE(PromotedBeforeBarrier(r));
  EXPECT_TRUE(TimelineJson(r, clock.Now())["promotion"]["before_barrier"].get<bool>());
  EXPECT_NE(PromotionText(r).find("before the barrier"), std::string::npos);
  r.promote_sent = t0 + milliseconds(1350);
  EXPECT_FALSE(PromotedBeforeBarrier(r));
  EXPECT_FALSE(TimelineJson(r, clock.Now())["promotion"]["before_barrier"].get<bool>());
  EXPECT_NE(PromotionText(r).find("after the barrier (the standby was not ready"),
            std::string::npos)
      << PromotionText(r);
  r.waited = "no reserve";
  EXPECT_FALSE(PromotedBeforeBarrier(r));
  EXPECT_NE(PromotionText(r).find("waited for the barrier (no reserve)"), std::string::npos);
}

// A barrier that gave up after gpu.release_timeout_ms is said to have, in JSON and text.
TEST(Timeline, ABarrierThatTimedOutIsShownAsOne) {
  FakeClock clock;
  TimelineLog log(clock);
  PromotionRecord& r = log.Open(PromotionKind::kFailover, "died");
  r.detected = clock.Now();
  r.promote_sent = clock.Now();
  EXPECT_FALSE(TimelineJson(r, clock.Now())["promotion"]["barrier_timed_out"].get<bool>());
  EXPECT_EQ(TimelineText(r, clock.Now()).find("barrier: timed out"), std::string::npos);
  r.barrier_timed_out = true;
  r.barrier_passed = clock.Now() + milliseconds(5000);
  EXPECT_TRUE(TimelineJson(r, clock.Now())["promotion"]["barrier_timed_out"].get<bool>());
  EXPECT_NE(TimelineText(r, clock.Now()).find("barrier: timed out"), std::string::npos);
}

TEST(Timeline, InjectionIsTheEvidenceForADrill) {
  FakeClock clock;
  TimelineLog log(clock);
  PromotionRecord& r = log.Open(PromotionKind::kFailover, "drill kill");
  r.injected = clock.Now();
  r.last_heartbeat = clock.Now() - milliseconds(50);
  r.detected = clock.Now() + milliseconds(2);
  EXPECT_DOUBLE_EQ(*PhasesOf(r).detect_ms, 2);
  EXPECT_FALSE(PhasesOf(r).ready_ms.has_value());
}

TEST(Timeline, BoundedAndClosed) {
  FakeClock clock;
  TimelineLog log(clock, 2);
  EXPECT_EQ(log.current(), nullptr);
  EXPECT_EQ(log.last(), nullptr);
  log.Open(PromotionKind::kPromotion, "a");
  log.Open(PromotionKind::kFailover, "b");  // supersedes a
  EXPECT_EQ(log.records().front().outcome, "superseded");
  log.Close("serving");
  EXPECT_EQ(log.current(), nullptr);
  EXPECT_EQ(log.last()->outcome, "serving");
  log.Open(PromotionKind::kFailover, "c");
  EXPECT_EQ(log.records().size(), 2u);
  EXPECT_EQ(log.records().front().cause, "b");
  EXPECT_EQ(log.records().back().seq, 3u);
}

TEST(Timeline, AwaitingStandbyAfterPromotion) {
  FakeClock clock;
  TimelineLog log(clock);
  PromotionRecord& r = log.Open(PromotionKind::kFailover, "x");
  EXPECT_EQ(log.awaiting_standby(), nullptr);
  r.promote_acked = clock.Now();
  log.Close("serving");
  ASSERT_NE(log.awaiting_standby(), nullptr);
  log.awaiting_standby()->standby_ready = clock.Now();
  EXPECT_EQ(log.awaiting_standby(), nullptr);
}

TEST(Timeline, WallTimeIsIso8601) {
  FakeClock clock;
  const std::string t = WallTime(clock.Now(), clock.Now());
  ASSERT_EQ(t.size(), 24u) << t;
  EXPECT_EQ(t[10], 'T');
  EXPECT_EQ(t.back(), 'Z');
}

TEST(Timeline, EveryKindRoundTrips) {
  for (PromotionKind kind : kPromotionKinds) {
    Result<PromotionKind> back = ParsePromotionKind(ToString(kind));
    ASSERT_TRUE(back.ok()) << ToString(kind) << ": " << back.status().ToString();
    EXPECT_EQ(*back, kind) << ToString(kind);
  }
  Result<PromotionKind> bad = ParsePromotionKind("takeover");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("unknown promotion kind 'takeover'"), std::string::npos)
      << bad.status().message();
}

}  // namespace
}  // namespace baton
