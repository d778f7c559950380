#include "proto/transport/channel.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "proto/transport/listener.h"
#include "tests/proto/proto_test_util.h"

namespace baton::proto {
namespace {

using namespace std::chrono_literals;
using testing::HeaderFor;
using testing::Pipe;
using testing::RawFrame;
using testing::SendRaw;

class ChannelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto pair = Channel::Pair(io_, ChannelOptions{.label = "test"});
    ASSERT_TRUE(pair.ok()) << pair.status().ToString();
    a_.emplace(std::move(pair->first));
    b_.emplace(std::move(pair->second));
  }
  Channel& a() { return *a_; }
  Channel& b() { return *b_; }

  // Expects `b` to refuse what `a` sent, with `reason` in the error.
  void ExpectRefused(const std::string& reason) {
    Result<ReceivedMessage> got = b().Receive(5s);
    ASSERT_FALSE(got.ok()) << "accepted a message of type " << MsgTypeName(got->type);
    EXPECT_NE(got.status().message().find(reason), std::string::npos) << got.status().ToString();
    EXPECT_FALSE(b().is_open());
    // The sender is told why before the connection closes.
    Result<ReceivedMessage> told = a().Receive(5s);
    ASSERT_TRUE(told.ok()) << told.status().ToString();
    Result<Heartbeat> as = told->As<Heartbeat>();
    EXPECT_NE(as.status().message().find(reason), std::string::npos) << as.status().ToString();
    EXPECT_EQ(a().Receive(5s).status().code(), StatusCode::kUnavailable);
  }

  boost::asio::io_context io_;
  std::optional<Channel> a_, b_;
};

TEST_F(ChannelTest, SendsAndReceivesMessages) {
  for (uint64_t i = 0; i < 100; ++i) ASSERT_TRUE(a().Send(Heartbeat{.epoch = 7, .seq = i}).ok());
  for (uint64_t i = 0; i < 100; ++i) {
    Result<ReceivedMessage> msg = b().Receive(5s);
    ASSERT_TRUE(msg.ok()) << msg.status().ToString();
    EXPECT_EQ(msg->type, MsgType::kHeartbeat);
    EXPECT_TRUE(msg->fds.empty());
    Result<Heartbeat> hb = msg->As<Heartbeat>();
    ASSERT_TRUE(hb.ok());
    EXPECT_EQ(hb->seq, i);
  }
}

// Unread: bytes in the socket, then a frame the channel read with another but has not
// returned yet; nothing once every frame is returned.
TEST_F(ChannelTest, HasUnreadCountsTheSocketAndItsOwnBuffer) {
  EXPECT_FALSE(b().HasUnread());
  ASSERT_TRUE(a().Send(Heartbeat{.epoch = 1, .seq = 1}).ok());
  ASSERT_TRUE(a().Send(Heartbeat{.epoch = 1, .seq = 2}).ok());
  EXPECT_TRUE(b().HasUnread()) << "in the socket";
  ASSERT_TRUE(b().Receive(5s).ok());
  EXPECT_TRUE(b().HasUnread()) << "the second frame, read with the first";
  ASSERT_TRUE(b().Receive(5s).ok());
  EXPECT_FALSE(b().HasUnread());
}

TEST_F(ChannelTest, PassesFileDescriptors) {
  Pipe p1, p2;
  ASSERT_TRUE(
      a().Send(
             ShareMemory{
                 .name = "pipes", .size = 0, .kind = 1, .huge_pages = false, .writable = true},
             std::vector<int>{p1.write_end.get(), p2.write_end.get()})
          .ok());
  Result<ReceivedMessage> msg = b().Receive(5s);
  ASSERT_TRUE(msg.ok()) << msg.status().ToString();
  ASSERT_EQ(msg->fds.size(), 2u);
  // Received fds are close-on-exec and reach the same pipes, in order.
  EXPECT_TRUE(::fcntl(msg->fds[0].get(), F_GETFD) & FD_CLOEXEC);
  ASSERT_EQ(::write(msg->fds[0].get(), "1", 1), 1);
  ASSERT_EQ(::write(msg->fds[1].get(), "2", 1), 1);
  char c = 0;
  ASSERT_EQ(::read(p1.read_end.get(), &c, 1), 1);
  EXPECT_EQ(c, '1');
  ASSERT_EQ(::read(p2.read_end.get(), &c, 1), 1);
  EXPECT_EQ(c, '2');
}

TEST_F(ChannelTest, FdsStayWithTheirFramesAcrossBackToBackSends) {
  std::vector<Pipe> pipes(6);
  for (size_t i = 0; i < pipes.size(); ++i) {
    std::vector<int> fds;
    if (i % 2 == 1) fds.push_back(pipes[i].write_end.get());
    ASSERT_TRUE(a().Send(Heartbeat{.epoch = 0, .seq = i}, fds).ok());
  }
  for (size_t i = 0; i < pipes.size(); ++i) {
    Result<ReceivedMessage> msg = b().Receive(5s);
    ASSERT_TRUE(msg.ok()) << msg.status().ToString();
    ASSERT_EQ(msg->fds.size(), i % 2);
    if (i % 2 == 0) continue;
    ASSERT_EQ(::write(msg->fds[0].get(), "x", 1), 1);
    char c;
    EXPECT_EQ(::read(pipes[i].read_end.get(), &c, 1), 1) << "frame " << i;
  }
}

TEST_F(ChannelTest, LargeFrameWithFdsWhileThePeerReadsSlowly) {
  Pipe pipe;
  TensorTable table{.model = "big", .arena_size = 0, .tensors = {}};
  for (int i = 0; i < 5000; ++i) {
    table.tensors.push_back({.name = "layer." + std::to_string(i) + ".weight",
                             .dtype = 4,
                             .shape = {64, 64, 3},
                             .offset = uint64_t(i) * 8192,
                             .size = 8192});
  }
  Result<std::string> payload = Encode(table);
  ASSERT_TRUE(payload.ok());
  ASSERT_GT(payload->size(), 300000u);  // larger than the socket buffer: several partial writes
  std::thread reader([&] {
    std::this_thread::sleep_for(50ms);
    Result<ReceivedMessage> msg = b().Receive(10s);
    ASSERT_TRUE(msg.ok()) << msg.status().ToString();
    EXPECT_EQ(msg->fds.size(), 1u);
    Result<TensorTable> back = msg->As<TensorTable>();
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(back->tensors.size(), 5000u);
    EXPECT_EQ(back->tensors[4999].name, "layer.4999.weight");
  });
  EXPECT_TRUE(a().Send(table, std::vector<int>{pipe.write_end.get()}).ok());
  reader.join();
}

// A RegisterAck carries the whole tensor table: a DeepSeek-V3-sized one (90 000 tensors, about
// 8 MB) goes from the controller to an engine, whose channels allow kControllerMaxFrameSize.
TEST(ControllerFrameTest, AMoeSizedTensorTableFits) {
  boost::asio::io_context io;
  auto pair = Channel::Pair(io, ChannelOptions{.max_frame_size = kControllerMaxFrameSize,
                                               .max_send_frame_size = kControllerMaxFrameSize,
                                               .label = "controller"});
  ASSERT_TRUE(pair.ok()) << pair.status().ToString();
  TensorTable table{.model = "moe", .arena_size = 0, .tensors = {}};
  for (int i = 0; i < 90000; ++i) {
    table.tensors.push_back({.name = "model.layers." + std::to_string(i / 768) + ".mlp.experts." +
                                     std::to_string(i % 256) + ".down_proj.weight" +
                                     std::to_string(i % 3),
                             .dtype = 4,
                             .shape = {7168, 2048},
                             .offset = uint64_t(i) << 20,
                             .size = 1 << 20});
  }
  Result<std::string> payload = Encode(table);
  ASSERT_TRUE(payload.ok());
  ASSERT_GT(payload->size(), kDefaultMaxFrameSize);
  std::thread reader([&] {
    Result<ReceivedMessage> msg = pair->second.Receive(30s);
    ASSERT_TRUE(msg.ok()) << msg.status().ToString();
    Result<TensorTable> back = msg->As<TensorTable>();
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(back->tensors.size(), 90000u);
  });
  EXPECT_TRUE(pair->first.Send(table).ok());
  reader.join();
}

TEST_F(ChannelTest, OversizedSendIsRefusedLocally) {
  HelloReject big{.reason = std::string(kDefaultMaxFrameSize, 'r')};
  const Status s = a().Send(big);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  EXPECT_TRUE(a().is_open());
}

TEST_F(ChannelTest, ReceiveTimesOutAndStaysOpen) {
  Result<ReceivedMessage> msg = b().Receive(20ms);
  EXPECT_EQ(msg.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(b().is_open());
  ASSERT_TRUE(a().Send(Heartbeat{}).ok());
  EXPECT_TRUE(b().Receive(5s).ok());
}

TEST_F(ChannelTest, PeerCloseIsUnavailable) {
  a().Close();
  Result<ReceivedMessage> msg = b().Receive(5s);
  EXPECT_EQ(msg.status().code(), StatusCode::kUnavailable);
  EXPECT_FALSE(b().is_open());
  EXPECT_EQ(b().Send(Heartbeat{}).code(), StatusCode::kUnavailable);
}

TEST_F(ChannelTest, SendToClosedPeerIsUnavailable) {
  b().Close();
  Status s = a().Send(Heartbeat{});
  for (int i = 0; i < 10 && s.ok(); ++i) s = a().Send(Heartbeat{});
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
}

TEST_F(ChannelTest, RefusesFrameThatDeclaresMoreFdsThanArrive) {
  Result<std::string> payload = Encode(Heartbeat{});
  ASSERT_TRUE(payload.ok());
  const std::string frame =
      RawFrame(HeaderFor(static_cast<uint16_t>(MsgType::kHeartbeat), *payload, 1), *payload);
  ASSERT_GT(SendRaw(a().native_handle(), frame), 0);
  ExpectRefused("Heartbeat frame declares 1 fds, 0 arrived");
}

TEST_F(ChannelTest, RefusesFdsThatArriveWithAFrameDeclaringNone) {
  Pipe pipe;
  Result<std::string> payload = Encode(Heartbeat{});
  ASSERT_TRUE(payload.ok());
  const std::string frame =
      RawFrame(HeaderFor(static_cast<uint16_t>(MsgType::kHeartbeat), *payload, 0), *payload);
  // The next frame is already on its way, half sent: the stray fd must not slide into it.
  ASSERT_GT(SendRaw(a().native_handle(), frame, {pipe.write_end.get()}), 0);
  ASSERT_GT(SendRaw(a().native_handle(), frame.substr(0, 10)), 0);
  ExpectRefused("Heartbeat frame declares 0 fds, 1 arrived");
}

TEST_F(ChannelTest, RefusesMoreFdsThanTheLimitInOneSend) {
  std::vector<Pipe> pipes(kMaxFdsPerFrame + 2);
  std::vector<int> fds;
  for (auto& p : pipes) fds.push_back(p.write_end.get());
  Result<std::string> payload = Encode(Heartbeat{});
  ASSERT_TRUE(payload.ok());
  const std::string frame =
      RawFrame(HeaderFor(static_cast<uint16_t>(MsgType::kHeartbeat), *payload, 0), *payload);
  ASSERT_GT(SendRaw(a().native_handle(), frame, fds), 0);
  ExpectRefused("MSG_CTRUNC");
}

TEST_F(ChannelTest, RefusesTruncatedFrameAtEndOfStream) {
  Result<std::string> frame = EncodeFrame(static_cast<uint16_t>(MsgType::kHeartbeat), "0123456789");
  ASSERT_TRUE(frame.ok());
  ASSERT_GT(SendRaw(a().native_handle(), frame->substr(0, 25)), 0);
  ASSERT_EQ(::shutdown(a().native_handle(), SHUT_WR), 0);
  ExpectRefused("truncated frame");
}

TEST_F(ChannelTest, RefusesUnknownType) {
  Result<std::string> frame = EncodeFrame(999, "x");
  ASSERT_TRUE(frame.ok());
  ASSERT_GT(SendRaw(a().native_handle(), *frame), 0);
  ExpectRefused("unknown message type 999");
}

TEST_F(ChannelTest, AsReportsWrongTypeAndPeerErrors) {
  ASSERT_TRUE(a().Send(Heartbeat{}).ok());
  ASSERT_TRUE(a().Send(ErrorMsg::FromStatus(NotFound("no such model 'x'"))).ok());
  Result<ReceivedMessage> hb = b().Receive(5s);
  ASSERT_TRUE(hb.ok());
  EXPECT_NE(hb->As<HelloAck>().status().message().find("expected HelloAck, got Heartbeat"),
            std::string::npos);
  Result<ReceivedMessage> err = b().Receive(5s);
  ASSERT_TRUE(err.ok());
  Status s = err->As<HelloAck>().status();
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("no such model 'x'"), std::string::npos);
}

TEST_F(ChannelTest, AsyncReceiveOnTheIoContext) {
  std::vector<uint64_t> seqs;
  Status final_status;
  std::function<void(Result<ReceivedMessage>)> on_message = [&](Result<ReceivedMessage> msg) {
    if (!msg.ok()) {
      final_status = msg.status();
      return;
    }
    seqs.push_back(msg->As<Heartbeat>()->seq);
    b().AsyncReceive(on_message);
  };
  b().AsyncReceive(on_message);
  std::thread sender([&] {
    for (uint64_t i = 0; i < 20; ++i) {
      ASSERT_TRUE(a().Send(Heartbeat{.epoch = 1, .seq = i}).ok());
      if (i % 5 == 0) std::this_thread::sleep_for(1ms);
    }
    a().Close();
  });
  io_.run_for(10s);
  sender.join();
  ASSERT_EQ(seqs.size(), 20u);
  for (uint64_t i = 0; i < 20; ++i) EXPECT_EQ(seqs[i], i);
  EXPECT_EQ(final_status.code(), StatusCode::kUnavailable) << final_status.ToString();
}

TEST_F(ChannelTest, DestroyingAChannelDropsItsPendingReceive) {
  bool called = false;
  b().AsyncReceive([&](Result<ReceivedMessage>) { called = true; });
  b_.reset();
  io_.run_for(100ms);
  EXPECT_FALSE(called);
}

TEST(ListenerTest, ConnectAcceptAndCredentials) {
  testing::TempDir dir;
  boost::asio::io_context io;
  Result<Listener> listener = Listener::Bind(io, dir.File("ctl.sock"));
  ASSERT_TRUE(listener.ok()) << listener.status().ToString();
  Result<Channel> client = Connect(io, dir.File("ctl.sock"), ChannelOptions{.label = "ctl"});
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  Result<Channel> server = listener->Accept(5s);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  EXPECT_NE(server->label().find("pid " + std::to_string(::getpid())), std::string::npos);
  Result<PeerCredentials> cred = server->peer_credentials();
  ASSERT_TRUE(cred.ok());
  EXPECT_EQ(cred->pid, ::getpid());
  EXPECT_EQ(cred->uid, ::getuid());
  ASSERT_TRUE(client->Send(Heartbeat{.epoch = 3, .seq = 4}).ok());
  Result<ReceivedMessage> msg = server->Receive(5s);
  ASSERT_TRUE(msg.ok());
  EXPECT_EQ(msg->As<Heartbeat>()->epoch, 3u);
  EXPECT_EQ(listener->Accept(10ms).status().code(), StatusCode::kDeadlineExceeded);
  // Neither end reaches a process the holder starts (the controller starts engines).
  EXPECT_NE(::fcntl(client->native_handle(), F_GETFD) & FD_CLOEXEC, 0);
  EXPECT_NE(::fcntl(server->native_handle(), F_GETFD) & FD_CLOEXEC, 0);
  boost::asio::io_context pair_io;
  auto pair = Channel::Pair(pair_io, ChannelOptions{.label = "pair"});
  ASSERT_TRUE(pair.ok());
  EXPECT_NE(::fcntl(pair->first.native_handle(), F_GETFD) & FD_CLOEXEC, 0);
  EXPECT_NE(::fcntl(pair->second.native_handle(), F_GETFD) & FD_CLOEXEC, 0);
}

TEST(ListenerTest, RefusesALivePathAndReplacesAStaleOne) {
  testing::TempDir dir;
  const std::string path = dir.File("ctl.sock");
  boost::asio::io_context io;
  {
    Result<Listener> first = Listener::Bind(io, path);
    ASSERT_TRUE(first.ok());
    Result<Listener> second = Listener::Bind(io, path);
    EXPECT_EQ(second.status().code(), StatusCode::kAlreadyExists) << second.status().ToString();
  }
  EXPECT_FALSE(std::filesystem::exists(path));  // unlinked by the destructor
  // A socket file with nobody listening (a crashed owner) is replaced.
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strcpy(addr.sun_path, path.c_str());
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ::close(fd);
  Result<Listener> again = Listener::Bind(io, path);
  EXPECT_TRUE(again.ok()) << again.status().ToString();
  // A regular file is never replaced.
  const std::string file = dir.File("not-a-socket");
  { std::ofstream(file) << "data"; }
  EXPECT_EQ(Listener::Bind(io, file).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(Listener::Bind(io, "/tmp/" + std::string(200, 'x')).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(Connect(io, dir.File("nobody.sock")).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(Connect(io, dir.File("nobody.sock"), {}, 1s).status().code(), StatusCode::kUnavailable);
}

// A process that accepts nothing (frozen) with a full backlog: connect(2) would wait for room
// forever, and batonctl --timeout-ms with it. The timeout bounds the wait.
TEST(ListenerTest, ConnectToAFullBacklogEndsAtTheTimeout) {
  testing::TempDir dir;
  const std::string path = dir.File("frozen.sock");
  const int listener = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(listener, 0), 0);
  std::vector<int> queued;  // until the backlog is full
  for (int i = 0; i < 64; ++i) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    ASSERT_GE(fd, 0);
    queued.push_back(fd);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) break;
  }
  ASSERT_EQ(errno, EAGAIN) << "the backlog never filled";
  boost::asio::io_context io;
  const auto start = std::chrono::steady_clock::now();
  Result<Channel> client = Connect(io, path, {}, 200ms);
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(client.status().code(), StatusCode::kDeadlineExceeded) << client.status().ToString();
  EXPECT_NE(client.status().message().find("no room in its backlog within 200 ms"),
            std::string::npos)
      << client.status().ToString();
  EXPECT_GE(took, 190ms);
  EXPECT_LT(took, 3s);
  // Room again: the same call connects, and its socket keeps no send timeout.
  ::close(queued.back());
  queued.pop_back();
  const int accepted = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
  ASSERT_GE(accepted, 0);
  client = Connect(io, path, {}, 200ms);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  timeval tv{.tv_sec = 1, .tv_usec = 0};
  socklen_t len = sizeof(tv);
  ASSERT_EQ(::getsockopt(client->native_handle(), SOL_SOCKET, SO_SNDTIMEO, &tv, &len), 0);
  EXPECT_EQ(tv.tv_sec, 0);
  EXPECT_EQ(tv.tv_usec, 0);
  ::close(accepted);
  for (const int fd : queued) ::close(fd);
  ::close(listener);
}

}  // namespace
}  // namespace baton::proto
