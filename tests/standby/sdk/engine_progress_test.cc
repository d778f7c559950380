// The engine's progress reports (EngineSession::ReportProgress, baton_engine_report_progress)
// reach the controller with the heartbeats, on protocol 11 and only once reported; an older
// controller is sent none.
#include <gtest/gtest.h>

#include <future>
#include <string>
#include <thread>

#include "standby/sdk/baton_engine.h"
#include "standby/sdk/engine_sdk.h"
#include "tests/standby/fake_controller.h"

namespace baton::testing {
namespace {

// The next Progress within 30 s (heartbeats skipped); an empty one when none came.
proto::Progress NextProgress(FakeController& fake) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < until) {
    Result<proto::ReceivedMessage> msg = fake.channel().Receive(std::chrono::milliseconds(500));
    if (!msg.ok() || msg->type != proto::MsgType::kProgress) continue;
    Result<proto::Progress> progress = msg->As<proto::Progress>();
    if (progress.ok()) return *progress;
  }
  ADD_FAILURE() << "no Progress within 30 s";
  return proto::Progress{.steps_done = ~0ull};
}

TEST(EngineProgress, ReportedProgressReachesTheControllerWithTheHeartbeats) {
  FakeController fake;
  std::unique_ptr<EngineSession> s = ConnectSession(fake, 20, fake.ReattachingOptions());
  ASSERT_NE(s, nullptr);
  // Nothing reported yet: heartbeats alone.
  for (int i = 0; i < 3; ++i) (void)fake.Expect<proto::Heartbeat>();
  EXPECT_EQ(fake.progress_messages(), 0);
  EXPECT_EQ(s->progress_sent(), 0u);

  s->ReportProgress(12, 3);
  proto::Progress got = NextProgress(fake);
  EXPECT_EQ(got.epoch, 0u);
  EXPECT_EQ(got.steps_done, 12u);
  EXPECT_EQ(got.work_pending, 3u);
  s->ReportProgress(13, 0);
  while (got.steps_done == 12u) got = NextProgress(fake);
  EXPECT_EQ(got.steps_done, 13u);
  EXPECT_EQ(got.work_pending, 0u);
  // The session counts a Progress once its send returned, which may be after the fake read it.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (s->progress_sent() < 2u && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_GE(s->progress_sent(), 2u);
}

TEST(EngineProgress, AControllerOlderThanProtocol11IsSentNone) {
  FakeController fake;
  fake.registration_max_version = proto::kProtocolVersionProgress - 1;
  std::unique_ptr<EngineSession> s = ConnectSession(fake, 20, fake.ReattachingOptions());
  ASSERT_NE(s, nullptr);
  s->ReportProgress(5, 1);
  for (int i = 0; i < 5; ++i) (void)fake.Expect<proto::Heartbeat>();
  EXPECT_EQ(fake.progress_messages(), 0);
  EXPECT_EQ(s->progress_sent(), 0u);
}

TEST(EngineProgress, TheCAbiReportsProgress) {
  FakeController fake;
  const std::string socket = fake.socket_path();
  baton_engine_options options{};
  options.socket_path = socket.c_str();
  options.launch_token = kToken;
  options.engine_id = kEngineId;
  options.engine_version = "sdk-test";
  baton_engine* engine = nullptr;
  auto connected = std::async(std::launch::async, [&] {
    return baton_engine_connect_flags(&options, BATON_ENGINE_HANDLES_RESUME, &engine);
  });
  fake.ServeRegistration(fake.Ack(20));
  ASSERT_EQ(connected.get(), 0) << baton_engine_last_error();
  ASSERT_EQ(baton_engine_report_progress(engine, 7, 2), 0);
  const proto::Progress got = NextProgress(fake);
  EXPECT_EQ(got.steps_done, 7u);
  EXPECT_EQ(got.work_pending, 2u);
  EXPECT_EQ(baton_engine_report_progress(nullptr, 1, 1),
            static_cast<int>(StatusCode::kInvalidArgument));
  baton_engine_close(engine);
}

}  // namespace
}  // namespace baton::testing
