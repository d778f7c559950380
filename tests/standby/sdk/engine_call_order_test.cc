// Calls made out of order are refused by the SDK at once (FailedPrecondition), not sent to a
// controller that would refuse them later with only a log line: a second WaitForPromotion,
// RequestBlocks as a standby, ReportDrained with no drain pending. Also what the C ABI takes
// from the environment when the options leave a launch field out, and a STOP's epoch.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <future>
#include <string>

#include "standby/sdk/baton_engine.h"
#include "standby/sdk/engine_sdk.h"
#include "tests/standby/fake_controller.h"

namespace baton::testing {
namespace {

using std::chrono::seconds;

constexpr int kFailedPrecondition = static_cast<int>(StatusCode::kFailedPrecondition);

// Sets (or unsets, for nullptr) the three launch variables; the other tests of this binary
// pass their launch details explicitly.
void SetLaunchEnv(const char* socket, const char* token, const char* engine_id) {
  const char* names[] = {"BATON_SOCKET", "BATON_LAUNCH_TOKEN", "BATON_ENGINE_ID"};
  const char* values[] = {socket, token, engine_id};
  for (int i = 0; i < 3; ++i) {
    if (values[i] == nullptr) {
      ::unsetenv(names[i]);
    } else {
      ::setenv(names[i], values[i], 1);
    }
  }
}

void Promote(FakeController& fake, EngineSession& s, uint64_t epoch) {
  ASSERT_TRUE(fake.channel().Send(proto::Promote{.epoch = epoch, .extents = {{0, 2}}}).ok());
  Result<SessionEvent> promoted = s.WaitForPromotion(seconds(30));
  ASSERT_TRUE(promoted.ok()) << promoted.status().ToString();
}

TEST(EngineCallOrder, ASecondWaitForPromotionFailsAtOnce) {
  FakeController fake;
  std::unique_ptr<EngineSession> s = ConnectSession(fake, 50);
  ASSERT_NE(s, nullptr);
  Promote(fake, *s, 5);
  Result<SessionEvent> again = s->WaitForPromotion();  // no timeout: it used to block forever
  EXPECT_EQ(again.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(again.status().message().find("already promoted"), std::string::npos)
      << again.status().ToString();
}

TEST(EngineCallOrder, AStandbyCannotRequestBlocks) {
  FakeController fake;
  std::unique_ptr<EngineSession> s = ConnectSession(fake, 50);
  ASSERT_NE(s, nullptr);
  const Status refused = s->RequestBlocks(1);
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition) << refused.ToString();
  EXPECT_NE(refused.message().find("not promoted"), std::string::npos) << refused.ToString();
  Promote(fake, *s, 3);
  ASSERT_TRUE(s->MarkServing().ok());
  (void)fake.Expect<proto::PromoteAck>();
  ASSERT_TRUE(s->RequestBlocks(1).ok());
  EXPECT_EQ(fake.Expect<proto::LeaseRequest>().blocks, 1u) << "the standby's request never went";
}

TEST(EngineCallOrder, ReportDrainedNeedsADrainPendingAndAnswersItOnce) {
  FakeController fake;
  std::unique_ptr<EngineSession> s = ConnectSession(fake, 50);
  ASSERT_NE(s, nullptr);
  const Status unasked = s->ReportDrained(0);
  EXPECT_EQ(unasked.code(), StatusCode::kFailedPrecondition) << unasked.ToString();
  EXPECT_NE(unasked.message().find("no drain pending"), std::string::npos) << unasked.ToString();

  ASSERT_TRUE(fake.channel().Send(proto::Drain{.epoch = 0, .timeout_ms = 250}).ok());
  std::optional<SessionEvent> drain = s->NextEvent(seconds(30));
  ASSERT_TRUE(drain.has_value());
  ASSERT_EQ(drain->kind, SessionEventKind::kDrain);
  ASSERT_TRUE(s->ReportDrained(2).ok());
  EXPECT_EQ(fake.Expect<proto::Drained>().unfinished, 2u) << "the unasked one was never sent";
  EXPECT_EQ(s->ReportDrained(0).code(), StatusCode::kFailedPrecondition) << "answered already";
}

TEST(EngineCallOrder, ACalledOffDrainIsStillAnsweredOnce) {
  FakeController fake;
  std::unique_ptr<EngineSession> s = ConnectSession(fake, 50);
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(fake.channel().Send(proto::Drain{.epoch = 0, .timeout_ms = 60000}).ok());
  ASSERT_TRUE(fake.channel().Send(proto::Resume{.epoch = 0}).ok());
  std::optional<SessionEvent> drain = s->NextEvent(seconds(30));
  ASSERT_TRUE(drain.has_value());
  ASSERT_EQ(drain->kind, SessionEventKind::kDrain);
  std::optional<SessionEvent> resume = s->NextEvent(seconds(30));
  ASSERT_TRUE(resume.has_value());
  ASSERT_EQ(resume->kind, SessionEventKind::kResume);
  ASSERT_TRUE(s->ReportDrained(1).ok()) << "the controller counts the answer to each drain";
  EXPECT_EQ(fake.Expect<proto::Drained>().unfinished, 1u);
  EXPECT_EQ(s->ReportDrained(0).code(), StatusCode::kFailedPrecondition);
}

TEST(EngineCallOrder, AStopCarriesTheEpochTheEngineHeld) {
  FakeController fake;
  std::unique_ptr<EngineSession> s = ConnectSession(fake, 50);
  ASSERT_NE(s, nullptr);
  Promote(fake, *s, 5);
  ASSERT_TRUE(fake.channel().Send(proto::Stop{.reason = "the controller is shutting down"}).ok());
  std::optional<SessionEvent> stop = s->NextEvent(seconds(30));
  ASSERT_TRUE(stop.has_value());
  ASSERT_EQ(stop->kind, SessionEventKind::kStop);
  EXPECT_EQ(stop->epoch, 5u);
}

TEST(EngineCallOrder, TheCAbiRefusesCallsOutOfOrder) {
  FakeController fake;
  const std::string socket = fake.socket_path();
  baton_engine_options options{};
  options.socket_path = socket.c_str();
  options.launch_token = kToken;
  options.engine_id = kEngineId;
  options.engine_version = "sdk-test";
  baton_engine* engine = nullptr;
  auto connected =
      std::async(std::launch::async, [&] { return baton_engine_connect(&options, &engine); });
  fake.ServeRegistration(fake.Ack(50));
  ASSERT_EQ(connected.get(), 0) << baton_engine_last_error();
  EXPECT_EQ(baton_engine_request_blocks(engine, 1), kFailedPrecondition);
  EXPECT_EQ(baton_engine_report_drained(engine, 0), kFailedPrecondition);
  ASSERT_TRUE(fake.channel().Send(proto::Promote{.epoch = 4, .extents = {{0, 1}}}).ok());
  baton_event event{};
  ASSERT_EQ(baton_engine_wait_promotion(engine, 30000, &event), 0) << baton_engine_last_error();
  EXPECT_EQ(baton_engine_wait_promotion(engine, -1, &event), kFailedPrecondition);
  ASSERT_TRUE(fake.channel().Send(proto::Stop{.reason = "bye"}).ok());
  ASSERT_EQ(baton_engine_next_event(engine, 30000, &event), 0);
  ASSERT_EQ(event.kind, BATON_EVENT_STOP);
  EXPECT_EQ(event.epoch, 4u);
  baton_engine_close(engine);
}

// Each launch field the options leave out is read from its own variable; the error names the
// variable actually missing, not BATON_SOCKET.
TEST(EngineCallOrder, EachMissingLaunchFieldComesFromItsOwnVariable) {
  FakeController fake;
  const std::string socket = fake.socket_path();
  baton_engine_options options{};
  options.socket_path = socket.c_str();
  options.launch_token = kToken;
  options.engine_version = "sdk-test";
  baton_engine* engine = nullptr;
  SetLaunchEnv(nullptr, nullptr, nullptr);
  EXPECT_EQ(baton_engine_connect(&options, &engine),
            static_cast<int>(StatusCode::kInvalidArgument));
  EXPECT_NE(std::string(baton_engine_last_error()).find("BATON_ENGINE_ID"), std::string::npos)
      << baton_engine_last_error();
  options.engine_id = kEngineId;
  options.launch_token = "";
  EXPECT_EQ(baton_engine_connect(&options, &engine),
            static_cast<int>(StatusCode::kInvalidArgument));
  EXPECT_NE(std::string(baton_engine_last_error()).find("BATON_LAUNCH_TOKEN"), std::string::npos)
      << baton_engine_last_error();

  // Socket and token given, the engine id alone from the environment.
  options.launch_token = kToken;
  options.engine_id = 0;
  SetLaunchEnv(nullptr, nullptr, std::to_string(kEngineId).c_str());
  auto connected =
      std::async(std::launch::async, [&] { return baton_engine_connect(&options, &engine); });
  fake.ServeRegistration(fake.Ack(50));
  const int rc = connected.get();
  SetLaunchEnv(nullptr, nullptr, nullptr);
  ASSERT_EQ(rc, 0) << baton_engine_last_error();
  EXPECT_EQ(baton_engine_id(engine), kEngineId);
  baton_engine_close(engine);
}

}  // namespace
}  // namespace baton::testing
