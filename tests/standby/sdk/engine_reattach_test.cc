// The engine SDK when its controller goes away: the engine keeps what it holds, reconnects to
// the next controller on the same socket path and reattaches (engine_sdk.h, step 5).
#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "standby/sdk/engine_sdk.h"
#include "tests/standby/fake_controller.h"
#include "tests/standby/sdk/mappings_testutil.h"

namespace baton::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// The next event, which must be of `kind`.
SessionEvent ExpectEvent(EngineSession& s, SessionEventKind kind) {
  std::optional<SessionEvent> event = s.NextEvent(seconds(10));
  if (!event.has_value()) {
    ADD_FAILURE() << "no event; expected " << ToString(kind);
    return SessionEvent{};
  }
  EXPECT_EQ(event->kind, kind) << ToString(event->kind) << ": " << event->reason;
  return *event;
}

// Promotes `s` at `epoch` with `extents`.
void Promote(FakeController& fake, EngineSession& s, uint64_t epoch,
             std::vector<proto::BlockRange> extents) {
  ASSERT_TRUE(fake.channel().Send(proto::Promote{.epoch = epoch, .extents = extents}).ok());
  Result<SessionEvent> promoted = s.WaitForPromotion(seconds(10));
  ASSERT_TRUE(promoted.ok()) << promoted.status().ToString();
}

// `fake` goes away; the session notices.
void LoseController(FakeController& fake, EngineSession& s) {
  fake.GoAway();
  ExpectEvent(s, SessionEventKind::kControllerLost);
}

// `fake` takes the Reattach it was sent and acknowledges it; the session is back.
void AckReattach(FakeController& fake, EngineSession& s) {
  ASSERT_TRUE(fake.channel()
                  .Send(proto::ReattachAck{.engine_id = kEngineId, .heartbeat_interval_ms = 50})
                  .ok());
  ExpectEvent(s, SessionEventKind::kControllerBack);
}

void ExpectSameMemory(const proto::Reattach& r, const FakeController& first) {
  EXPECT_EQ(std::make_pair(r.arena_dev, r.arena_ino), first.arena_identity());
  EXPECT_EQ(std::make_pair(r.pool_dev, r.pool_ino), first.pool_identity());
}

TEST(EngineReattach, APrimaryServesOnWhileTheControllerIsAwayAndReattaches) {
  FakeController first;
  std::unique_ptr<EngineSession> s = ConnectSession(first, 50, first.ReattachingOptions());
  ASSERT_NE(s, nullptr);
  Promote(first, *s, 7, {{1, 3}});
  ASSERT_TRUE(s->MarkServing().ok());
  first.Expect<proto::PromoteAck>();

  LoseController(first, *s);
  // No controller listens now: the engine keeps its epoch and its blocks, sends nothing.
  const uint64_t beats = s->heartbeats_sent();
  std::this_thread::sleep_for(milliseconds(100));  // reconnect attempts find no socket
  EXPECT_TRUE(s->CheckEpoch().ok()) << s->CheckEpoch().ToString();
  EXPECT_EQ(s->epoch(), 7u);
  EXPECT_TRUE(AllWritable(MappingsIn(s->pool().BlockData(1), 3 * kFakeBlockBytes)));
  ASSERT_EQ(s->extents().size(), 1u);
  EXPECT_EQ(s->extents()[0], (MappedExtent{.first = 1, .count = 3}));
  EXPECT_EQ(s->heartbeats_sent(), beats) << "no heartbeats while the controller is away";
  EXPECT_EQ(s->RequestBlocks(1).code(), StatusCode::kUnavailable);
  // A return while away unmaps and is not reported: the Reattach lists what is mapped.
  const MappedExtent give{.first = 3, .count = 1};
  EXPECT_TRUE(s->ReturnBlocks(std::span<const MappedExtent>(&give, 1)).ok());
  EXPECT_FALSE(AnyWritable(MappingsIn(s->pool().BlockData(3), kFakeBlockBytes)));

  FakeController second(first.socket_path());
  const proto::Reattach r = second.AcceptReattach();
  EXPECT_EQ(r.engine_id, kEngineId);
  EXPECT_EQ(r.engine_version, "sdk-test");
  EXPECT_EQ(r.http_address, "127.0.0.1:1");
  EXPECT_EQ(r.role, static_cast<uint8_t>(proto::ReattachRole::kServing));
  EXPECT_EQ(r.epoch, 7u);
  EXPECT_EQ(r.extents, (std::vector<proto::BlockRange>{{1, 2}}));
  ExpectSameMemory(r, first);
  AckReattach(second, *s);
  EXPECT_EQ(second.Expect<proto::Heartbeat>().epoch, 7u) << "heartbeats resume";
  ASSERT_TRUE(s->RequestBlocks(1).ok());
  EXPECT_EQ(second.Expect<proto::LeaseRequest>().epoch, 7u);
  EXPECT_TRUE(s->CheckEpoch().ok());
}

TEST(EngineReattach, AStandbyReattachesAsAStandbyAndAStopEndsTheSession) {
  FakeController first;
  std::unique_ptr<EngineSession> s = ConnectSession(first, 50, first.ReattachingOptions());
  ASSERT_NE(s, nullptr);
  LoseController(first, *s);
  EXPECT_TRUE(s->CheckEpoch().ok());
  EXPECT_FALSE(AnyWritable(MappingsIn(s->pool().base, s->pool().reserved_bytes))) << "rule 5";

  FakeController second(first.socket_path());
  const proto::Reattach r = second.AcceptReattach();
  EXPECT_EQ(r.role, static_cast<uint8_t>(proto::ReattachRole::kStandby));
  EXPECT_EQ(r.epoch, 0u);
  EXPECT_TRUE(r.extents.empty());
  ExpectSameMemory(r, first);
  ASSERT_TRUE(second.channel().Send(proto::Stop{.reason = "not in the roster"}).ok());
  const SessionEvent stop = ExpectEvent(*s, SessionEventKind::kStop);
  EXPECT_NE(stop.reason.find("not in the roster"), std::string::npos) << stop.reason;
  EXPECT_EQ(s->CheckEpoch().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(s->WaitForPromotion(seconds(1)).status().code(), StatusCode::kFailedPrecondition);
  second.GoAway();
  FakeController third(first.socket_path());
  EXPECT_FALSE(third.AnyConnectionWithin(milliseconds(300))) << "a stopped engine reconnects";
}

TEST(EngineReattach, AHelloRejectEndsTheSession) {
  FakeController first;
  std::unique_ptr<EngineSession> s = ConnectSession(first, 50, first.ReattachingOptions());
  ASSERT_NE(s, nullptr);
  Promote(first, *s, 2, {{0, 1}});
  LoseController(first, *s);
  FakeController second(first.socket_path());
  EXPECT_FALSE(second.AcceptHello(/*admit_token=*/false));
  const SessionEvent stop = ExpectEvent(*s, SessionEventKind::kStop);
  EXPECT_NE(stop.reason.find("unknown launch token"), std::string::npos) << stop.reason;
  EXPECT_EQ(s->CheckEpoch().code(), StatusCode::kFailedPrecondition);
}

TEST(EngineReattach, AControllerTooOldForReattachEndsTheSession) {
  FakeController first;
  std::unique_ptr<EngineSession> s = ConnectSession(first, 50, first.ReattachingOptions());
  ASSERT_NE(s, nullptr);
  LoseController(first, *s);
  FakeController second(first.socket_path());
  EXPECT_FALSE(second.AcceptHello(true, proto::kProtocolVersionReattach - 1));
  const SessionEvent stop = ExpectEvent(*s, SessionEventKind::kStop);
  EXPECT_NE(stop.reason.find("version mismatch"), std::string::npos) << stop.reason;
  EXPECT_FALSE(s->CheckEpoch().ok());
}

TEST(EngineReattach, AReattachAckForAnotherEngineEndsTheSession) {
  FakeController first;
  std::unique_ptr<EngineSession> s = ConnectSession(first, 50, first.ReattachingOptions());
  ASSERT_NE(s, nullptr);
  LoseController(first, *s);
  FakeController second(first.socket_path());
  second.AcceptReattach();
  ASSERT_TRUE(second.channel()
                  .Send(proto::ReattachAck{.engine_id = kEngineId + 1, .heartbeat_interval_ms = 50})
                  .ok());
  const SessionEvent stop = ExpectEvent(*s, SessionEventKind::kStop);
  EXPECT_NE(stop.reason.find("engine 43"), std::string::npos) << stop.reason;
}

TEST(EngineReattach, ToldToStopTheSessionGivesUpAfterTheAbsentTimeout) {
  FakeClock clock;
  FakeController first;
  EngineSessionOptions options = first.ReattachingOptions();
  options.clock = &clock;
  options.controller_absent_timeout = seconds(10);
  options.on_controller_absent = ControllerAbsentAction::kStop;
  std::unique_ptr<EngineSession> s = ConnectSession(first, 50, options);
  ASSERT_NE(s, nullptr);
  Promote(first, *s, 4, {{0, 2}});
  LoseController(first, *s);
  std::this_thread::sleep_for(milliseconds(100));  // real time passes, the clock does not
  EXPECT_FALSE(s->NextEvent(Duration::zero()).has_value());
  EXPECT_TRUE(s->CheckEpoch().ok());
  clock.Advance(seconds(9));
  EXPECT_FALSE(s->NextEvent(milliseconds(100)).has_value()) << "9 s is not yet the timeout";
  clock.Advance(seconds(2));
  const SessionEvent gone = ExpectEvent(*s, SessionEventKind::kDisconnected);
  EXPECT_NE(gone.reason.find("within 10000 ms"), std::string::npos) << gone.reason;
  EXPECT_EQ(s->CheckEpoch().code(), StatusCode::kUnavailable);
}

TEST(EngineReattach, ToServeTheSessionServesOnPastTheAbsentTimeout) {
  FakeClock clock;
  FakeController first;
  EngineSessionOptions options = first.ReattachingOptions();
  options.clock = &clock;
  options.controller_absent_timeout = seconds(10);
  std::unique_ptr<EngineSession> s = ConnectSession(first, 50, options);
  ASSERT_NE(s, nullptr);
  Promote(first, *s, 4, {{0, 2}});
  LoseController(first, *s);
  clock.Advance(seconds(60));
  EXPECT_FALSE(s->NextEvent(milliseconds(100)).has_value());
  EXPECT_TRUE(s->CheckEpoch().ok());
  FakeController second(first.socket_path());
  EXPECT_EQ(second.AcceptReattach().epoch, 4u) << "still reconnecting";
  AckReattach(second, *s);
  // Changed while the session waits: the next absence ends it at once.
  s->SetControllerAbsence(seconds(1), ControllerAbsentAction::kStop);
  LoseController(second, *s);
  clock.Advance(seconds(2));
  ExpectEvent(*s, SessionEventKind::kDisconnected);
}

TEST(EngineReattach, MarkServingWhileAwayMakesTheReattachSayServing) {
  FakeController first;
  std::unique_ptr<EngineSession> s = ConnectSession(first, 50, first.ReattachingOptions());
  ASSERT_NE(s, nullptr);
  Promote(first, *s, 3, {{0, 1}});
  LoseController(first, *s);
  FakeController second(first.socket_path());
  proto::Reattach r = second.AcceptReattach();
  EXPECT_EQ(r.role, static_cast<uint8_t>(proto::ReattachRole::kPromoted));
  EXPECT_EQ(r.epoch, 3u);
  AckReattach(second, *s);

  LoseController(second, *s);
  EXPECT_TRUE(s->MarkServing().ok()) << "while away: said by the next Reattach";
  FakeController third(first.socket_path());
  r = third.AcceptReattach();
  EXPECT_EQ(r.role, static_cast<uint8_t>(proto::ReattachRole::kServing));
  EXPECT_EQ(r.extents, (std::vector<proto::BlockRange>{{0, 1}}));
}

TEST(EngineReattach, ReportDrainedWhileAwayMakesTheReattachSayDrained) {
  FakeController first;
  std::unique_ptr<EngineSession> s = ConnectSession(first, 50, first.ReattachingOptions());
  ASSERT_NE(s, nullptr);
  Promote(first, *s, 6, {{2, 2}});
  ASSERT_TRUE(s->MarkServing().ok());
  ASSERT_TRUE(first.channel().Send(proto::Drain{.epoch = 6, .timeout_ms = 1000}).ok());
  ExpectEvent(*s, SessionEventKind::kDrain);
  LoseController(first, *s);
  FakeController second(first.socket_path());
  EXPECT_EQ(second.AcceptReattach().role, static_cast<uint8_t>(proto::ReattachRole::kDraining));
  AckReattach(second, *s);

  LoseController(second, *s);
  EXPECT_TRUE(s->ReportDrained(0).ok()) << "while away: said by the next Reattach";
  FakeController third(first.socket_path());
  EXPECT_EQ(third.AcceptReattach().role, static_cast<uint8_t>(proto::ReattachRole::kDrained));
}

// Between the Reattach and its ack the engine may still change what it holds: the session
// tells the controller right after the ack, so that the two never part.
TEST(EngineReattach, WhatChangesBeforeTheAckIsSentAfterIt) {
  FakeController first;
  std::unique_ptr<EngineSession> s = ConnectSession(first, 50, first.ReattachingOptions());
  ASSERT_NE(s, nullptr);
  Promote(first, *s, 5, {{0, 4}});
  LoseController(first, *s);
  FakeController second(first.socket_path());
  const proto::Reattach r = second.AcceptReattach();
  EXPECT_EQ(r.role, static_cast<uint8_t>(proto::ReattachRole::kPromoted));
  EXPECT_EQ(r.extents, (std::vector<proto::BlockRange>{{0, 4}}));
  ASSERT_TRUE(s->MarkServing().ok());
  const MappedExtent give{.first = 3, .count = 1};
  ASSERT_TRUE(s->ReturnBlocks(std::span<const MappedExtent>(&give, 1)).ok());
  AckReattach(second, *s);
  const proto::ReturnExtents returned = second.Expect<proto::ReturnExtents>();
  EXPECT_EQ(returned.epoch, 5u);
  EXPECT_EQ(returned.extents, (std::vector<proto::BlockRange>{{3, 1}}));
  const proto::PromoteAck ack = second.Expect<proto::PromoteAck>();
  EXPECT_EQ(ack.epoch, 5u);
  EXPECT_EQ(ack.blocks_mapped, 3u);
}

TEST(EngineReattach, AnErrorReportedWhileAwayGoesToTheNextController) {
  FakeController first;
  std::unique_ptr<EngineSession> s = ConnectSession(first, 50, first.ReattachingOptions());
  ASSERT_NE(s, nullptr);
  Promote(first, *s, 8, {{0, 1}});
  LoseController(first, *s);
  EXPECT_EQ(s->ReportError(DataLoss("sticky device error")).code(), StatusCode::kUnavailable);
  EXPECT_FALSE(s->CheckEpoch().ok()) << "the engine stops writing at once";
  FakeController second(first.socket_path());
  second.AcceptReattach();
  AckReattach(second, *s);
  const proto::ErrorReport report = second.Expect<proto::ErrorReport>();
  EXPECT_EQ(report.epoch, 8u);
  EXPECT_EQ(report.message, "sticky device error");
}

// Shutdown() while a reconnect waits for the controller's answer returns at once, not after
// the handshake's timeout (a minute here).
TEST(EngineReattach, ShutdownInterruptsAReattachInProgress) {
  FakeController first;
  EngineSessionOptions options = first.ReattachingOptions();
  options.connect_timeout = seconds(60);
  std::unique_ptr<EngineSession> s = ConnectSession(first, 50, options);
  ASSERT_NE(s, nullptr);
  LoseController(first, *s);
  FakeController second(first.socket_path());
  second.AcceptReattach();  // and never answered
  auto shutdown = std::async(std::launch::async, [&] { s->Shutdown(); });
  EXPECT_EQ(shutdown.wait_for(seconds(20)), std::future_status::ready);
}

// Protocol 2 (no handles_resume) cannot reattach: a lost controller ends the session.
TEST(EngineReattach, WithoutProtocol5ALostControllerEndsTheSession) {
  FakeController first;
  std::unique_ptr<EngineSession> s = ConnectSession(first, 50);
  ASSERT_NE(s, nullptr);
  first.GoAway();
  ExpectEvent(*s, SessionEventKind::kDisconnected);
  EXPECT_EQ(s->CheckEpoch().code(), StatusCode::kUnavailable);
}

TEST(EngineReattach, EventKindsHaveNames) {
  EXPECT_STREQ(ToString(SessionEventKind::kControllerLost), "controller_lost");
  EXPECT_STREQ(ToString(SessionEventKind::kControllerBack), "controller_back");
  EXPECT_STREQ(ToString(ControllerAbsentAction::kStop), "stop");
}

TEST(EngineReattach, ControllerAbsenceComesFromTheEnvironment) {
  constexpr const char* kTimeout = "BATON_CONTROLLER_ABSENT_TIMEOUT_MS";
  constexpr const char* kAction = "BATON_ON_CONTROLLER_ABSENT";
  ::unsetenv(kTimeout);
  ::unsetenv(kAction);
  EngineSessionOptions options;
  ASSERT_TRUE(ControllerAbsenceFromEnv(&options).ok());
  EXPECT_EQ(options.controller_absent_timeout, Duration::zero()) << "never decide";
  EXPECT_EQ(options.on_controller_absent, ControllerAbsentAction::kServe);

  ::setenv(kTimeout, "250", 1);
  ::setenv(kAction, "stop", 1);
  ASSERT_TRUE(ControllerAbsenceFromEnv(&options).ok());
  EXPECT_EQ(options.controller_absent_timeout, milliseconds(250));
  EXPECT_EQ(options.on_controller_absent, ControllerAbsentAction::kStop);

  ::setenv(kTimeout, "12ms", 1);
  Status bad = ControllerAbsenceFromEnv(&options);
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find(kTimeout), std::string::npos) << bad.message();
  ::setenv(kTimeout, "-5", 1);
  EXPECT_FALSE(ControllerAbsenceFromEnv(&options).ok());
  ::setenv(kTimeout, "0", 1);
  ::setenv(kAction, "exit", 1);
  bad = ControllerAbsenceFromEnv(&options);
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find(kAction), std::string::npos) << bad.message();
  EXPECT_EQ(options.controller_absent_timeout, milliseconds(250)) << "a refusal changes nothing";
  ::setenv(kAction, "serve", 1);
  ASSERT_TRUE(ControllerAbsenceFromEnv(&options).ok());
  EXPECT_EQ(options.controller_absent_timeout, Duration::zero());
  EXPECT_EQ(options.on_controller_absent, ControllerAbsentAction::kServe);
  ::unsetenv(kTimeout);
  ::unsetenv(kAction);
}

}  // namespace
}  // namespace baton::testing
