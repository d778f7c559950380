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
  r.old_engine = 1;
  r.detected = t0;
  r.promote_sent = t0 + milliseconds(1);
  r.barrier_passed = t0 + milliseconds(30);
  EXPECT_TRUE(PromotedBeforeBarrier(r));
  EXPECT_TRUE(TimelineJson(r, clock.Now())["promotion"]["before_barrier"].get<bool>());
  EXPECT_NE(PromotionText(r).find("before the barrier"), std::string::npos);
  r.reserve_blocks = 1;
  r.quarantined_blocks = 15;
  EXPECT_NE(PromotionText(r).find("on a reserve of 1 block; 15 blocks quarantined"),
            std::string::npos)
      << PromotionText(r);
  const PromotionRecord::KvInheritance one{
      .mode = proto::KvInheritMode::kCopied, .blocks = 1, .bytes = 2097152, .ms = 0.25};
  EXPECT_EQ(InheritanceText(one).rfind("copied 1 block (2097152 bytes) in 0.25 ms", 0), 0u)
      << InheritanceText(one);
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

// A promotion that followed no primary (a pair's first) fenced nothing and quarantined nothing:
// its promotion line says so, and names no reserve.
TEST(Timeline, APromotionWithNoOldPrimarySaysSo) {
  FakeClock clock;
  TimelineLog log(clock);
  PromotionRecord& r = log.Open(PromotionKind::kPromotion, "no primary");
  r.new_engine = 1;
  r.epoch = 1;
  r.epoch_durable = clock.Now();
  r.promote_sent = clock.Now();
  const std::string text = TimelineText(r, clock.Now());
  EXPECT_NE(text.find("\n  promotion: no old primary: nothing was fenced or quarantined\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("reserve"), std::string::npos) << text;
  EXPECT_FALSE(PromotedBeforeBarrier(r));
  EXPECT_FALSE(TimelineJson(r, clock.Now())["promotion"]["before_barrier"].get<bool>());
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

// A switch-over or an upgrade injects nothing: its evidence is the request to drain, and the
// canary that takes over serves at its own epoch, not the old primary's fence epoch.
TEST(Timeline, APlannedHandOverIsRequestedNotInjected) {
  FakeClock clock;
  TimelineLog log(clock);
  PromotionRecord& r = log.Open(PromotionKind::kUpgrade, "canary passed every step");
  r.requested = clock.Now();
  r.detected = clock.Now() + milliseconds(40);  // drained
  r.old_engine = 1;
  r.new_engine = 3;
  r.fence_epoch = 3;
  r.epoch = 2;
  EXPECT_DOUBLE_EQ(*PhasesOf(r).detect_ms, 40);
  const std::string text = TimelineText(r, clock.Now());
  EXPECT_NE(text.find("engine 1 -> engine 3 at epoch 2 (engine 1 fenced at epoch 3)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("requested"), std::string::npos) << text;
  EXPECT_EQ(text.find("injected"), std::string::npos) << text;
  const nlohmann::json j = TimelineJson(r, clock.Now());
  EXPECT_EQ(j["epoch"], 2);
  EXPECT_EQ(j["fence_epoch"], 3);
  EXPECT_FALSE(j["stamps"].contains("injected_ms")) << j.dump();
  EXPECT_EQ(log.Fenced(1, 3), &r) << "found by the fence epoch";
  EXPECT_EQ(log.Fenced(1, 2), nullptr);
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
