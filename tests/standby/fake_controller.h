// FakeController: the controller's side of the engine protocol, scripted by a test, for
// testing the engine SDK in-process. It listens on a Unix socket in a temporary directory,
// owns a small weight arena (a memfd with known bytes and a two-tensor table) and a pool
// memfd it maps itself (to see what the engine writes and to plant block headers), and
// answers Hello/Register with the real messages. Every call blocks with a timeout; the
// engine session under test runs its Connect on another thread.
//
// A controller that crashes or is replaced: GoAway() closes the connection and the listener
// (the socket path is removed); a second FakeController made with the first one's
// socket_path() then listens there and takes the engine's reconnect (AcceptReattach()). The
// first must outlive the second (the path lies in its temporary directory); its memfds are
// the memory the engine still maps (arena_identity(), pool_identity()).
//
// Header-only test support; used from the test's main thread.
#pragma once

#include <gtest/gtest.h>
#include <sys/stat.h>

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

// (st_dev, st_ino) of `fd`, as a Reattach reports it.
inline std::pair<uint64_t, uint64_t> FileIdentityOf(int fd) {
  struct stat st {};
  EXPECT_EQ(::fstat(fd, &st), 0);
  return {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
}

class FakeController {
 public:
  FakeController() : FakeController(std::string()) {}
  // Listens on `socket_path` (another fake's, after it went away); "" for a new one.
  explicit FakeController(std::string socket_path)
      : socket_path_(socket_path.empty() ? dir_.File("controller.sock") : std::move(socket_path)) {
    arena_ =
        Take(SharedMemory::Create({.name = "fake-weights", .size = 8192, .try_huge_pages = false}));
    Mapping arena_rw = Take(arena_.Map(Protection::kReadWrite));
    for (size_t i = 0; i < 8192; ++i) arena_rw.data()[i] = static_cast<uint8_t>(i * 7);
    pool_ = Take(SharedMemory::Create(
        {.name = "baton-pool", .size = kFakeBlocks * kFakeBlockBytes, .try_huge_pages = false}));
    pool_map_ = Take(pool_.Map(Protection::kReadWrite));
    listener_.emplace(Take(proto::Listener::Bind(io_, socket_path_)));
  }

  std::string socket_path() const { return socket_path_; }
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
    o.connect_timeout = std::chrono::seconds(30);
    return o;
  }
  // Options() of an engine that speaks protocol 5 and so reattaches after a lost controller.
  EngineSessionOptions ReattachingOptions() const {
    EngineSessionOptions o = Options();
    o.handles_resume = true;
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
    if (!AcceptHello(true, registration_max_version)) return;
    proto::Register reg = Expect<proto::Register>();
    EXPECT_EQ(reg.engine_id, kEngineId);
    EXPECT_EQ(reg.engine_version, "sdk-test");
    const int all[2] = {arena_.fd(), pool_.fd()};
    ASSERT_TRUE(channel_->Send(ack, std::span<const int>(all, static_cast<size_t>(fds))).ok());
    if (expect_ready) Expect<proto::StandbyReady>();
  }
  // The same, with a partial arena of two memfds: RegisterAck carries [first, pool, second].
  void ServePartialRegistration(const proto::RegisterAck& ack, const SharedMemory& first,
                                const SharedMemory& second, bool expect_ready = true) {
    if (!AcceptHello()) return;
    (void)Expect<proto::Register>();
    const int all[3] = {first.fd(), pool_.fd(), second.fd()};
    ASSERT_TRUE(channel_->Send(ack, std::span<const int>(all, 3)).ok());
    if (expect_ready) Expect<proto::StandbyReady>();
  }

  // Accepts the next connection and answers its Hello, speaking protocol versions up to
  // `max_version`; refuses the engine's launch token when `admit_token` is false. Whether the
  // Hello was accepted.
  bool AcceptHello(bool admit_token = true, uint16_t max_version = proto::kProtocolVersionMax) {
    Result<proto::Channel> accepted = listener_->Accept(std::chrono::seconds(10));
    EXPECT_TRUE(accepted.ok()) << accepted.status().ToString();
    if (!accepted.ok()) return false;
    channel_.emplace(std::move(accepted).value());
    proto::ServerHelloOptions hello{.server_name = "fake-controller", .max_version = max_version};
    hello.admit = [admit_token](const proto::Hello& h) {
      if (!admit_token) return FailedPrecondition("unknown launch token");
      return h.launch_token == kToken ? OkStatus() : FailedPrecondition("wrong launch token");
    };
    return proto::ServerHello(*channel_, hello).ok();
  }

  // A reconnecting engine's Hello, then its Reattach (left unanswered).
  proto::Reattach AcceptReattach() {
    if (!AcceptHello()) {
      ADD_FAILURE() << "the reconnecting engine's Hello was refused";
      return proto::Reattach{};
    }
    EXPECT_GE(channel_->version(), proto::kProtocolVersionReattach);
    return Expect<proto::Reattach>();
  }

  // Whether anything connects within `wait` (the connection is dropped).
  bool AnyConnectionWithin(std::chrono::milliseconds wait) { return listener_->Accept(wait).ok(); }

  // The controller crashes: the engine's connection and the listening socket close.
  void GoAway() {
    if (channel_.has_value()) channel_->Close();
    channel_.reset();
    if (listener_.has_value()) listener_->Close();
  }

  std::pair<uint64_t, uint64_t> arena_identity() const { return FileIdentityOf(arena_.fd()); }
  std::pair<uint64_t, uint64_t> pool_identity() const { return FileIdentityOf(pool_.fd()); }

  // The newest protocol version ServeRegistration's Hello speaks.
  uint16_t registration_max_version = proto::kProtocolVersionMax;

  // The next message other than a Heartbeat or a Progress (both counted; the latest kept).
  template <typename T>
  T Expect(std::chrono::seconds timeout = std::chrono::seconds(30)) {
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
      if (msg->type == proto::MsgType::kProgress && T::kType != proto::MsgType::kProgress) {
        last_progress_ = Take(msg->As<proto::Progress>());
        ++progress_;
        continue;
      }
      Result<T> decoded = msg->As<T>();
      if (!decoded.ok()) {
        ADD_FAILURE() << decoded.status().ToString();
        return T{};
      }
      last_fds_ = std::move(msg->fds);
      return *decoded;
    }
  }

  // The type of the next message other than a Heartbeat (counted) within `wait`; nullopt when
  // none came. Its fds go to last_fds().
  std::optional<proto::MsgType> NextWithin(std::chrono::milliseconds wait) {
    const auto until = std::chrono::steady_clock::now() + wait;
    while (true) {
      const Duration left = until - std::chrono::steady_clock::now();
      if (left <= Duration::zero()) return std::nullopt;
      Result<proto::ReceivedMessage> msg = channel_->Receive(left);
      if (!msg.ok()) return std::nullopt;
      if (msg->type == proto::MsgType::kHeartbeat) {
        ++heartbeats_;
        continue;
      }
      if (msg->type == proto::MsgType::kProgress) {
        last_progress_ = Take(msg->As<proto::Progress>());
        ++progress_;
        continue;
      }
      last_fds_ = std::move(msg->fds);
      return msg->type;
    }
  }

  int heartbeats() const { return heartbeats_; }
  // The fds that came with the last message Expect returned (StandbyReady's liveness page).
  std::vector<UniqueFd>& last_fds() { return last_fds_; }
  const proto::Heartbeat& last_heartbeat() const { return last_heartbeat_; }
  int progress_messages() const { return progress_; }
  const proto::Progress& last_progress() const { return last_progress_; }

 private:
  proto::testing::TempDir dir_;
  std::string socket_path_;
  boost::asio::io_context io_;
  SharedMemory arena_;
  SharedMemory pool_;
  Mapping pool_map_;
  std::optional<proto::Listener> listener_;
  std::optional<proto::Channel> channel_;
  proto::Heartbeat last_heartbeat_;
  int heartbeats_ = 0;
  proto::Progress last_progress_;
  int progress_ = 0;
  std::vector<UniqueFd> last_fds_;
};

// Connects an engine session with `options` to `fake` (registration served on this thread;
// StandbyReady awaited unless the session sends it only when it waits, ready_when_waiting).
inline std::unique_ptr<EngineSession> ConnectSession(FakeController& fake, uint32_t heartbeat_ms,
                                                     const EngineSessionOptions& options) {
  auto session = std::async(std::launch::async, [&] { return EngineSession::Connect(options); });
  fake.ServeRegistration(fake.Ack(heartbeat_ms), 2, !options.ready_when_waiting);
  Result<std::unique_ptr<EngineSession>> connected = session.get();
  EXPECT_TRUE(connected.ok()) << connected.status().ToString();
  return connected.ok() ? std::move(connected).value() : nullptr;
}

inline std::unique_ptr<EngineSession> ConnectSession(FakeController& fake, uint32_t heartbeat_ms) {
  return ConnectSession(fake, heartbeat_ms, fake.Options());
}

}  // namespace baton::testing
