// FakeController: the controller's side of the engine protocol, scripted by a test, for
// testing the engine SDK in-process. It listens on a Unix socket in a temporary directory,
// owns a small weight arena (a memfd with known bytes and a two-tensor table) and a pool
// memfd it maps itself (to see what the engine writes and to plant block headers), and
// answers Hello/Register with the real messages. Every call blocks with a timeout; the
// engine session under test runs its Connect on another thread.
//
// Header-only test support; used from the test's main thread.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <optional>
#include <string>

#include "proto/hello.h"
#include "proto/transport/listener.h"
#include "proto/transport/shared_memory.h"
#include "standby/sdk/engine_sdk.h"
#include "tests/proto/proto_test_util.h"

namespace baton::testing {

inline constexpr uint32_t kFakeBlocks = 8;
inline constexpr uint64_t kFakeBlockBytes = 64 * 1024;
inline constexpr uint64_t kEngineId = 42;
inline constexpr char kToken[] = "0123456789abcdef0123456789abcdef";

// The value of `r`, which the test requires to be OK.
template <typename T>
T Take(Result<T> r) {
  if (!r.ok()) {
    ADD_FAILURE() << r.status().ToString();
    std::abort();
  }
  return std::move(r).value();
}

class FakeController {
 public:
  FakeController() {
    arena_ =
        Take(SharedMemory::Create({.name = "fake-weights", .size = 8192, .try_huge_pages = false}));
    Mapping arena_rw = Take(arena_.Map(Protection::kReadWrite));
    for (size_t i = 0; i < 8192; ++i) arena_rw.data()[i] = static_cast<uint8_t>(i * 7);
    pool_ = Take(SharedMemory::Create(
        {.name = "baton-pool", .size = kFakeBlocks * kFakeBlockBytes, .try_huge_pages = false}));
    pool_map_ = Take(pool_.Map(Protection::kReadWrite));
    listener_.emplace(Take(proto::Listener::Bind(io_, dir_.File("controller.sock"))));
  }

  std::string socket_path() const { return dir_.File("controller.sock"); }
  uint8_t* block(uint32_t b) const { return pool_map_.data() + uint64_t{b} * kFakeBlockBytes; }
  proto::Channel& channel() { return *channel_; }

  EngineSessionOptions Options(uint64_t id = kEngineId, std::string token = kToken) const {
    EngineSessionOptions o;
    o.launch = EngineLaunchInfo{.socket_path = socket_path(),
                                .launch_token = std::move(token),
                                .engine_id = id,
                                .role = "standby",
                                .http_port = 0};
    o.engine_version = "sdk-test";
    o.http_address = "127.0.0.1:1";
    o.connect_timeout = std::chrono::seconds(5);
    return o;
  }

  proto::RegisterAck Ack(uint32_t heartbeat_ms) const {
    proto::RegisterAck ack{.engine_id = kEngineId,
                           .model = "fake",
                           .arena_size = 8192,
                           .arena_huge_pages = false,
                           .tensors = {},
                           .block_count = kFakeBlocks,
                           .block_bytes = kFakeBlockBytes,
                           .pool_huge_pages = false,
                           .reserve_bytes = kFakeBlocks * kFakeBlockBytes,
                           .heartbeat_interval_ms = heartbeat_ms};
    ack.tensors.push_back({"a", 2 /*F32*/, {4, 8}, 0, 128});
    ack.tensors.push_back({"b", 9 /*U8*/, {100}, 4096, 100});
    return ack;
  }

  // Serves Hello, Register and RegisterAck (`ack`, with `fds` fds) on the next connection;
  // waits for StandbyReady when `expect_ready`.
  void ServeRegistration(const proto::RegisterAck& ack, int fds = 2, bool expect_ready = true) {
    Result<proto::Channel> accepted = listener_->Accept(std::chrono::seconds(5));
    ASSERT_TRUE(accepted.ok()) << accepted.status().ToString();
    channel_.emplace(std::move(accepted).value());
    proto::ServerHelloOptions hello{.server_name = "fake-controller"};
    hello.admit = [](const proto::Hello& h) {
      return h.launch_token == kToken ? OkStatus() : FailedPrecondition("wrong launch token");
    };
    Result<proto::AcceptedHello> said = proto::ServerHello(*channel_, hello);
    if (!said.ok()) return;
    proto::Register reg = Expect<proto::Register>();
    EXPECT_EQ(reg.engine_id, kEngineId);
    EXPECT_EQ(reg.engine_version, "sdk-test");
    const int all[2] = {arena_.fd(), pool_.fd()};
    ASSERT_TRUE(channel_->Send(ack, std::span<const int>(all, static_cast<size_t>(fds))).ok());
    if (expect_ready) Expect<proto::StandbyReady>();
  }

  // The next message other than a Heartbeat (heartbeats are counted).
  template <typename T>
  T Expect(std::chrono::seconds timeout = std::chrono::seconds(5)) {
    while (true) {
      Result<proto::ReceivedMessage> msg = channel_->Receive(timeout);
      if (!msg.ok()) {
        ADD_FAILURE() << "expected " << proto::MsgTypeName(T::kType) << ": "
                      << msg.status().ToString();
        return T{};
      }
      if (msg->type == proto::MsgType::kHeartbeat && T::kType != proto::MsgType::kHeartbeat) {
        last_heartbeat_ = Take(msg->As<proto::Heartbeat>());
        ++heartbeats_;
        continue;
      }
      Result<T> decoded = msg->As<T>();
      if (!decoded.ok()) {
        ADD_FAILURE() << decoded.status().ToString();
        return T{};
      }
      return *decoded;
    }
  }

  int heartbeats() const { return heartbeats_; }
  const proto::Heartbeat& last_heartbeat() const { return last_heartbeat_; }

 private:
  proto::testing::TempDir dir_;
  boost::asio::io_context io_;
  SharedMemory arena_;
  SharedMemory pool_;
  Mapping pool_map_;
  std::optional<proto::Listener> listener_;
  std::optional<proto::Channel> channel_;
  proto::Heartbeat last_heartbeat_;
  int heartbeats_ = 0;
};

// Connects an engine session to `fake` (registration served on this thread).
inline std::unique_ptr<EngineSession> ConnectSession(FakeController& fake, uint32_t heartbeat_ms) {
  auto session =
      std::async(std::launch::async, [&] { return EngineSession::Connect(fake.Options()); });
  fake.ServeRegistration(fake.Ack(heartbeat_ms));
  Result<std::unique_ptr<EngineSession>> connected = session.get();
  EXPECT_TRUE(connected.ok()) << connected.status().ToString();
  return connected.ok() ? std::move(connected).value() : nullptr;
}

}  // namespace baton::testing
