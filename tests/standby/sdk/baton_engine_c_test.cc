// The C ABI (baton_engine.h) against the in-process fake controller.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <future>
#include <string>
#include <vector>

#include "standby/sdk/baton_engine.h"
#include "tests/standby/fake_controller.h"

namespace baton::testing {
namespace {

// Options naming `fake`'s socket (`socket` must outlive them), token and engine id.
baton_engine_options OptionsFor(const std::string& socket) {
  baton_engine_options options{};
  options.socket_path = socket.c_str();
  options.launch_token = kToken;
  options.engine_id = kEngineId;
  options.engine_version = "sdk-test";
  return options;
}

TEST(EngineCAbi, ConnectPromoteAndReport) {
  FakeController fake;
  const std::string socket = fake.socket_path();
  baton_engine_options options = OptionsFor(socket);
  options.http_address = "127.0.0.1:1";
  options.prefault_weights = 1;
  baton_engine* engine = nullptr;
  auto connected =
      std::async(std::launch::async, [&] { return baton_engine_connect(&options, &engine); });
  fake.ServeRegistration(fake.Ack(50));
  ASSERT_EQ(connected.get(), 0) << baton_engine_last_error();
  ASSERT_NE(engine, nullptr);
  EXPECT_EQ(baton_engine_abi_version(), BATON_ENGINE_ABI_VERSION);
  EXPECT_EQ(baton_engine_id(engine), kEngineId);

  ASSERT_EQ(baton_engine_tensor_count(engine), 2u);
  baton_tensor t{};
  ASSERT_EQ(baton_engine_find_tensor(engine, "a", &t), 0);
  EXPECT_STREQ(t.name, "a");
  EXPECT_EQ(t.ndim, 2u);
  EXPECT_EQ(t.shape[1], 8);
  EXPECT_EQ(baton_engine_find_tensor(engine, "zzz", &t), static_cast<int>(StatusCode::kNotFound));
  EXPECT_NE(std::string(baton_engine_last_error()).find("zzz"), std::string::npos);
  EXPECT_EQ(baton_engine_tensor(engine, 5, &t), static_cast<int>(StatusCode::kNotFound));
  // Tensor "b" lies at offset 4096 of the arena (the fake controller's table).
  ASSERT_EQ(baton_engine_find_tensor(engine, "b", &t), 0);
  EXPECT_EQ(static_cast<const char*>(t.data) -
                static_cast<const char*>(baton_engine_weights_base(engine)),
            4096);
  EXPECT_EQ(baton_engine_weights_base(nullptr), nullptr);

  baton_pool_info pool{};
  ASSERT_EQ(baton_engine_pool(engine, &pool), 0);
  EXPECT_EQ(pool.block_count, kFakeBlocks);
  EXPECT_EQ(pool.block_bytes, kFakeBlockBytes);

  baton_event event{};
  EXPECT_EQ(baton_engine_wait_promotion(engine, 10, &event),
            static_cast<int>(StatusCode::kDeadlineExceeded));
  ASSERT_TRUE(fake.channel().Send(proto::Promote{.epoch = 9, .extents = {{2, 3}}}).ok());
  ASSERT_EQ(baton_engine_wait_promotion(engine, 5000, &event), 0) << baton_engine_last_error();
  EXPECT_EQ(event.kind, BATON_EVENT_PROMOTED);
  EXPECT_EQ(event.epoch, 9u);
  ASSERT_EQ(event.extent_count, 1u);
  EXPECT_EQ(event.extents[0].first, 2u);
  EXPECT_EQ(event.extents[0].count, 3u);
  static_cast<uint8_t*>(event.extents[0].data)[kBlockHeaderBytes] = 0x11;
  EXPECT_EQ(fake.block(2)[kBlockHeaderBytes], 0x11);
  EXPECT_EQ(baton_engine_epoch(engine), 9u);
  EXPECT_EQ(baton_engine_check_epoch(engine), 0);
  ASSERT_EQ(baton_engine_mark_serving(engine), 0);
  EXPECT_EQ(fake.Expect<proto::PromoteAck>().blocks_mapped, 3u);

  baton_extent mapped[4];
  EXPECT_EQ(baton_engine_extents(engine, mapped, 4), 1u);
  baton_extent give{.first = 4, .count = 1, .data = nullptr, .bytes = 0};
  ASSERT_EQ(baton_engine_return_blocks(engine, &give, 1), 0);
  EXPECT_EQ(fake.Expect<proto::ReturnExtents>().extents.size(), 1u);

  ASSERT_EQ(baton_engine_next_event(engine, 0, &event), 0);
  EXPECT_EQ(event.kind, BATON_EVENT_NONE);
  ASSERT_EQ(baton_engine_report_error(engine, 999, "device lost"), 0);
  proto::ErrorReport report = fake.Expect<proto::ErrorReport>();
  EXPECT_EQ(report.code, static_cast<uint32_t>(StatusCode::kInternal));
  EXPECT_EQ(report.message, "device lost");
  EXPECT_NE(baton_engine_check_epoch(engine), 0);
  baton_engine_close(engine);
}

TEST(EngineCAbi, ConnectWithoutEnvironmentSaysWhatIsMissing) {
  ::unsetenv("BATON_SOCKET");
  baton_engine* engine = reinterpret_cast<baton_engine*>(0x1);
  EXPECT_EQ(baton_engine_connect(nullptr, &engine), static_cast<int>(StatusCode::kInvalidArgument));
  EXPECT_EQ(engine, nullptr);
  EXPECT_NE(std::string(baton_engine_last_error()).find("BATON_SOCKET"), std::string::npos);
  EXPECT_EQ(baton_engine_connect(nullptr, nullptr), static_cast<int>(StatusCode::kInvalidArgument));
  baton_engine_close(nullptr);
}

// A timeout too long for the clock waits (as a negative one does) instead of returning at once.
TEST(EngineCAbi, AHugeTimeoutWaitsForTheEvent) {
  FakeController fake;
  const std::string socket = fake.socket_path();
  baton_engine_options options = OptionsFor(socket);
  baton_engine* engine = nullptr;
  auto connected =
      std::async(std::launch::async, [&] { return baton_engine_connect(&options, &engine); });
  fake.ServeRegistration(fake.Ack(50));
  ASSERT_EQ(connected.get(), 0) << baton_engine_last_error();
  baton_event event{};
  auto next = std::async(std::launch::async,
                         [&] { return baton_engine_next_event(engine, INT64_MAX, &event); });
  EXPECT_EQ(next.wait_for(std::chrono::milliseconds(300)), std::future_status::timeout)
      << "returned at once: the timeout overflowed";
  ASSERT_TRUE(fake.channel().Send(proto::Stop{.reason = "test"}).ok());
  ASSERT_EQ(next.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_EQ(next.get(), 0);
  EXPECT_EQ(event.kind, BATON_EVENT_STOP);
  baton_engine_close(engine);
}

// Connects through the C ABI with `flags`; `fake` serves the registration.
baton_engine* ConnectWithFlags(FakeController& fake, const std::string& socket, unsigned flags) {
  baton_engine_options options = OptionsFor(socket);
  baton_engine* engine = nullptr;
  auto connected = std::async(std::launch::async,
                              [&] { return baton_engine_connect_flags(&options, flags, &engine); });
  fake.ServeRegistration(fake.Ack(50), 2,
                         /*expect_ready=*/(flags & BATON_ENGINE_READY_WHEN_WAITING) == 0);
  EXPECT_EQ(connected.get(), 0) << baton_engine_last_error();
  return engine;
}

// ABI 9: a Drain has a next primary to hand requests over to, a FinalDrain (`batonctl drain`)
// has none; baton_engine_drain_has_successor() tells them apart for the latest DRAIN event.
TEST(EngineCAbi, ADrainSaysWhetherANextPrimaryFollows) {
  FakeController fake;
  baton_engine* engine = ConnectWithFlags(fake, fake.socket_path(), 0);
  ASSERT_NE(engine, nullptr);
  EXPECT_GE(baton_engine_abi_version(), 9);
  baton_event event{};
  ASSERT_TRUE(fake.channel().Send(proto::FinalDrain{.epoch = 0, .timeout_ms = 300}).ok());
  ASSERT_EQ(baton_engine_next_event(engine, 10000, &event), 0) << baton_engine_last_error();
  EXPECT_EQ(event.kind, BATON_EVENT_DRAIN);
  EXPECT_EQ(event.timeout_ms, 300);
  EXPECT_EQ(baton_engine_drain_has_successor(engine), 0);
  ASSERT_EQ(baton_engine_report_drained(engine, 0), 0);
  EXPECT_EQ(fake.Expect<proto::Drained>().unfinished, 0u);
  ASSERT_TRUE(fake.channel().Send(proto::Drain{.epoch = 0, .timeout_ms = 300}).ok());
  ASSERT_EQ(baton_engine_next_event(engine, 10000, &event), 0) << baton_engine_last_error();
  EXPECT_EQ(event.kind, BATON_EVENT_DRAIN);
  EXPECT_EQ(baton_engine_drain_has_successor(engine), 1);
  EXPECT_EQ(baton_engine_drain_has_successor(nullptr), 1);
  baton_engine_close(engine);
}

// ABI 8: a standby connected with BATON_ENGINE_READY_WHEN_WAITING says it is ready at its
// first wait for the promotion; a flag this library does not know is refused.
TEST(EngineCAbi, ReadyWhenWaitingAndUnknownFlags) {
  FakeController fake;
  const std::string socket = fake.socket_path();
  baton_engine* engine = ConnectWithFlags(fake, socket, BATON_ENGINE_READY_WHEN_WAITING);
  ASSERT_NE(engine, nullptr);
  EXPECT_EQ(fake.NextWithin(std::chrono::milliseconds(200)), std::nullopt);
  baton_event event{};
  EXPECT_EQ(baton_engine_wait_promotion(engine, 10, &event),
            static_cast<int>(StatusCode::kDeadlineExceeded));
  EXPECT_EQ(fake.NextWithin(std::chrono::milliseconds(5000)), proto::MsgType::kStandbyReady);
  baton_engine_close(engine);
  baton_engine_options options = OptionsFor(socket);
  baton_engine* none = nullptr;
  EXPECT_EQ(baton_engine_connect_flags(&options, 16u, &none),
            static_cast<int>(StatusCode::kInvalidArgument));
  EXPECT_EQ(none, nullptr);
  EXPECT_NE(std::string(baton_engine_last_error()).find("unknown flags 16"), std::string::npos);
}

// ABI 4: an engine that asks for them sees the controller go; the session serves on until
// baton_engine_set_controller_absent() says to give up.
TEST(EngineCAbi, ControllerEventsAndGivingUpOnAnAbsentController) {
  FakeController fake;
  const std::string socket = fake.socket_path();
  baton_engine* engine =
      ConnectWithFlags(fake, socket, BATON_ENGINE_HANDLES_RESUME | BATON_ENGINE_CONTROLLER_EVENTS);
  ASSERT_NE(engine, nullptr);
  ASSERT_TRUE(fake.channel().Send(proto::Promote{.epoch = 2, .extents = {{0, 1}}}).ok());
  baton_event event{};
  ASSERT_EQ(baton_engine_wait_promotion(engine, 10000, &event), 0) << baton_engine_last_error();
  fake.GoAway();
  ASSERT_EQ(baton_engine_next_event(engine, 10000, &event), 0);
  EXPECT_EQ(event.kind, BATON_EVENT_CONTROLLER_LOST);
  EXPECT_EQ(baton_engine_check_epoch(engine), 0) << "serving on";
  EXPECT_EQ(baton_engine_request_blocks(engine, 1), static_cast<int>(StatusCode::kUnavailable));
  EXPECT_EQ(baton_engine_mark_serving(engine), 0);
  const int bad = static_cast<int>(StatusCode::kInvalidArgument);
  EXPECT_EQ(baton_engine_set_controller_absent(engine, -1, BATON_ON_CONTROLLER_ABSENT_STOP), bad);
  EXPECT_EQ(baton_engine_set_controller_absent(engine, 0, 7), bad);
  EXPECT_EQ(baton_engine_set_controller_absent(nullptr, 0, BATON_ON_CONTROLLER_ABSENT_SERVE), bad);
  ASSERT_EQ(baton_engine_set_controller_absent(engine, 1, BATON_ON_CONTROLLER_ABSENT_STOP), 0);
  ASSERT_EQ(baton_engine_next_event(engine, 10000, &event), 0);
  EXPECT_EQ(event.kind, BATON_EVENT_DISCONNECTED);
  EXPECT_NE(std::string(event.reason).find("no controller came back"), std::string::npos)
      << event.reason;
  EXPECT_NE(baton_engine_check_epoch(engine), 0);
  baton_engine_close(engine);
}

// An engine built for ABI 3 knows no CONTROLLER_* kinds: it is never given one.
TEST(EngineCAbi, AnEngineThatDidNotAskSeesNoControllerEvents) {
  FakeController first;
  const std::string socket = first.socket_path();
  baton_engine* engine = ConnectWithFlags(first, socket, BATON_ENGINE_HANDLES_RESUME);
  ASSERT_NE(engine, nullptr);
  first.GoAway();
  FakeController second(socket);
  EXPECT_EQ(second.AcceptReattach().engine_id, kEngineId);
  ASSERT_TRUE(second.channel()
                  .Send(proto::ReattachAck{.engine_id = kEngineId, .heartbeat_interval_ms = 50})
                  .ok());
  ASSERT_TRUE(second.channel().Send(proto::Stop{.reason = "bye"}).ok());
  baton_event event{};
  ASSERT_EQ(baton_engine_next_event(engine, 10000, &event), 0);
  EXPECT_EQ(event.kind, BATON_EVENT_STOP) << "CONTROLLER_LOST and _BACK are skipped";
  EXPECT_STREQ(event.reason, "bye");
  baton_engine_close(engine);
}

TEST(EngineCAbi, AMalformedAbsencePolicyFailsTheConnect) {
  ::setenv("BATON_ON_CONTROLLER_ABSENT", "exit", 1);
  const std::string socket = "/tmp/baton-no-such-controller.sock";
  baton_engine_options options = OptionsFor(socket);
  baton_engine* engine = reinterpret_cast<baton_engine*>(0x1);
  EXPECT_EQ(baton_engine_connect(&options, &engine),
            static_cast<int>(StatusCode::kInvalidArgument));
  EXPECT_EQ(engine, nullptr);
  EXPECT_NE(std::string(baton_engine_last_error()).find("BATON_ON_CONTROLLER_ABSENT"),
            std::string::npos)
      << baton_engine_last_error();
  ::unsetenv("BATON_ON_CONTROLLER_ABSENT");
}

// With no descriptor left, connecting fails with a code: no C++ exception reaches the caller
// (a C, ctypes or cgo caller would end in std::terminate).
TEST(EngineCAbi, ConnectWithoutFreeDescriptorsReturnsAnError) {
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const int lowest_free = ::dup(0);
    ::close(lowest_free);
    const rlimit none{.rlim_cur = static_cast<rlim_t>(lowest_free),
                      .rlim_max = static_cast<rlim_t>(lowest_free)};
    if (::setrlimit(RLIMIT_NOFILE, &none) != 0) ::_exit(100);
    baton_engine_options options{};
    options.socket_path = "/tmp/baton-no-such-controller.sock";
    options.connect_timeout_ms = 100;
    options.launch_token = kToken;
    options.engine_id = kEngineId;
    baton_engine* engine = nullptr;
    const int rc = baton_engine_connect(&options, &engine);
    ::_exit(rc == 0 || engine != nullptr ? 101 : 0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace baton::testing

namespace baton::testing {
namespace {

// ABI 5: what a KV-warm successor reads through the C ABI. The promotion's inherited headers,
// the quarantined blocks (read-only, their headers as of the promotion), their grant after the
// barrier with its headers, and the reports the controller gets.
TEST(EngineCAbi, KvWarmHandoffCalls) {
  FakeController fake;
  const std::string socket = fake.socket_path();
  baton_engine* engine = ConnectWithFlags(fake, socket, BATON_ENGINE_HANDLES_RESUME);
  ASSERT_NE(engine, nullptr);
  fake.block(2)[0] = 0x21;  // a record left in a promoted block
  fake.block(5)[0] = 0x51;  // and in the dying primary's, quarantined
  fake.block(6)[1] = 0x62;
  ASSERT_TRUE(
      fake.channel()
          .Send(proto::Quarantined{
              .epoch = 9, .extents = {{5, 2}}, .barrier_estimate_us = 1500, .wait_limit_ms = 200})
          .ok());
  ASSERT_TRUE(fake.channel().Send(proto::Promote{.epoch = 9, .extents = {{2, 3}}}).ok());
  baton_event event{};
  ASSERT_EQ(baton_engine_wait_promotion(engine, 5000, &event), 0) << baton_engine_last_error();
  std::vector<uint8_t> headers(8 * kBlockHeaderBytes);
  ASSERT_EQ(baton_engine_event_headers(engine, nullptr, 0), 3 * kBlockHeaderBytes);
  ASSERT_EQ(baton_engine_event_headers(engine, headers.data(), headers.size()),
            3 * kBlockHeaderBytes);
  EXPECT_EQ(headers[0], 0x21);
  EXPECT_EQ(fake.block(2)[0], 0) << "scrubbed for this engine";

  baton_extent q[2]{};
  int64_t estimate_us = 0, limit_ms = 0;
  ASSERT_EQ(baton_engine_quarantined(engine, q, 2, headers.data(), headers.size(), &estimate_us,
                                     &limit_ms),
            1u);
  EXPECT_EQ(q[0].first, 5u);
  EXPECT_EQ(q[0].count, 2u);
  EXPECT_EQ(q[0].data, nullptr) << "the promotion maps nothing of the quarantined blocks";
  EXPECT_EQ(headers[0], 0x51);
  EXPECT_EQ(headers[kBlockHeaderBytes + 1], 0x62);
  EXPECT_EQ(estimate_us, 1500);
  EXPECT_EQ(limit_ms, 200);
  ASSERT_EQ(baton_engine_map_quarantined(engine), 0) << baton_engine_last_error();
  ASSERT_EQ(baton_engine_quarantined(engine, q, 2, nullptr, 0, nullptr, nullptr), 1u);
  ASSERT_NE(q[0].data, nullptr);
  EXPECT_EQ(static_cast<const uint8_t*>(q[0].data)[0], 0x51) << "mapped read-only for a copy";

  EXPECT_EQ(baton_engine_wait_inherited_blocks(engine, 10, &event),
            static_cast<int>(StatusCode::kDeadlineExceeded));
  ASSERT_TRUE(fake.channel().Send(proto::Grant{.epoch = 9, .extents = {{5, 2}}}).ok());
  ASSERT_EQ(baton_engine_wait_inherited_blocks(engine, 5000, &event), 0)
      << baton_engine_last_error();
  EXPECT_EQ(event.kind, BATON_EVENT_GRANTED);
  ASSERT_EQ(baton_engine_event_headers(engine, headers.data(), headers.size()),
            2 * kBlockHeaderBytes);
  EXPECT_EQ(headers[0], 0x51);
  EXPECT_EQ(headers[kBlockHeaderBytes + 1], 0x62);
  ASSERT_EQ(baton_engine_release_quarantined(engine), 0);

  ASSERT_EQ(baton_engine_mark_serving(engine), 0);
  EXPECT_EQ(fake.Expect<proto::PromoteAck>().blocks_mapped, 5u);
  const char* reasons[] = {"torn"};
  const uint32_t counts[] = {2};
  ASSERT_EQ(baton_engine_report_kv_adoption(engine, 1, 300, reasons, counts, 1, 0.5), 0);
  const proto::KvAdopted adopted = fake.Expect<proto::KvAdopted>();
  EXPECT_EQ(adopted.adopted, 1u);
  EXPECT_EQ(adopted.tokens, 300u);
  EXPECT_EQ(adopted.dropped_reasons, std::vector<std::string>{"torn"});
  ASSERT_EQ(baton_engine_report_kv_inheritance(engine, BATON_KV_INHERIT_WAITED, 2, 100, 1, 0), 0);
  EXPECT_EQ(fake.Expect<proto::KvInherited>().blocks, 2u);
  EXPECT_EQ(baton_engine_report_kv_inheritance(engine, 9, 0, 0, 0, 0),
            static_cast<int>(StatusCode::kInvalidArgument));
  EXPECT_EQ(baton_engine_crc32c(0, "123456789", 9), 0xE3069283u);
  baton_engine_close(engine);
}

}  // namespace
}  // namespace baton::testing
