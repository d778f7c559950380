// A real server (Listener + AsyncReceive on an io_context thread) is fed one corrupt frame per
// connection. Each must be refused with a reason, told to the peer, and logged; afterwards the
// server still accepts a fresh connection and answers Hello and heartbeats.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <condition_variable>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "proto/hello.h"
#include "proto/transport/listener.h"
#include "tests/proto/proto_test_util.h"

namespace baton::proto {
namespace {

using namespace std::chrono_literals;
using testing::HeaderFor;
using testing::RawFrame;
using testing::SendRaw;

// Answers Hello, echoes heartbeats (seq + 1), and refuses anything malformed. All state but
// the refusal log lives on the io_context thread.
class EchoServer {
 public:
  explicit EchoServer(const std::string& path) {
    Result<Listener> listener = Listener::Bind(io_, path, ChannelOptions{.label = "client"});
    EXPECT_TRUE(listener.ok()) << listener.status().ToString();
    listener_.emplace(std::move(listener).value());
    AcceptNext();
    thread_ = std::thread([this] { io_.run(); });
  }

  ~EchoServer() {
    boost::asio::post(io_, [this] {
      listener_.reset();
      sessions_.clear();
      io_.stop();
    });
    thread_.join();
  }

  // Waits until `count` connections have been refused; returns the reasons.
  std::vector<std::string> WaitForRefusals(size_t count) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, 10s, [&] { return refusals_.size() >= count; });
    return refusals_;
  }

 private:
  struct Session {
    explicit Session(Channel c) : channel(std::move(c)) {}
    Channel channel;
    bool greeted = false;
  };
  using SessionIt = std::list<std::unique_ptr<Session>>::iterator;

  void AcceptNext() {
    listener_->AsyncAccept([this](Result<Channel> channel) {
      if (!channel.ok()) return;
      sessions_.push_back(std::make_unique<Session>(std::move(channel).value()));
      ReadNext(std::prev(sessions_.end()));
      AcceptNext();
    });
  }

  void ReadNext(SessionIt it) {
    (*it)->channel.AsyncReceive([this, it](Result<ReceivedMessage> msg) { OnMessage(it, msg); });
  }

  void OnMessage(SessionIt it, Result<ReceivedMessage>& msg) {
    Session& s = **it;
    Status refused;
    if (!msg.ok()) {
      if (msg.status().code() != StatusCode::kUnavailable) refused = msg.status();
    } else if (!s.greeted) {
      Result<AcceptedHello> hello =
          AnswerHello(s.channel, *msg, ServerHelloOptions{.server_name = "echo"});
      if (hello.ok()) {
        s.greeted = true;
        return ReadNext(it);
      }
      refused = hello.status();
    } else {
      Result<Heartbeat> hb = msg->As<Heartbeat>();
      if (hb.ok() && s.channel.Send(Heartbeat{.epoch = hb->epoch, .seq = hb->seq + 1}).ok()) {
        return ReadNext(it);
      }
      refused = hb.status();
      s.channel.CloseWithError(refused);
    }
    if (!refused.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      refusals_.push_back(refused.message());
      cv_.notify_all();
    }
    sessions_.erase(it);
  }

  boost::asio::io_context io_;
  std::optional<Listener> listener_;
  std::list<std::unique_ptr<Session>> sessions_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> refusals_;
};

struct Corruption {
  std::string name;
  std::string expected_reason;
  // Puts the corrupt bytes on a connected, greeted socket.
  std::function<void(int fd)> send;
};

std::string HeartbeatPayload() { return *Encode(Heartbeat{.epoch = 1, .seq = 1}); }
constexpr uint16_t kHeartbeatType = static_cast<uint16_t>(MsgType::kHeartbeat);

std::vector<Corruption> AllCorruptions(int spare_fd) {
  const std::string payload = HeartbeatPayload();
  const std::string good = RawFrame(HeaderFor(kHeartbeatType, payload), payload);
  std::vector<Corruption> all;
  all.push_back({"bad magic", "bad frame magic", [=](int fd) {
                   std::string f = good;
                   f.replace(0, 4, "HTTP");
                   SendRaw(fd, f);
                 }});
  all.push_back({"bad CRC", "CRC32C mismatch", [=](int fd) {
                   std::string f = good;
                   f.back() ^= 0x5a;
                   SendRaw(fd, f);
                 }});
  all.push_back({"oversized", "exceeds the limit of 1048576 bytes", [=](int fd) {
                   FrameHeader h = HeaderFor(kHeartbeatType, payload);
                   h.payload_length = 64u << 20;
                   SendRaw(fd, RawFrame(h, payload, false));
                 }});
  all.push_back({"truncated", "truncated frame", [=](int fd) {
                   SendRaw(fd, good.substr(0, good.size() - 3));
                   ::shutdown(fd, SHUT_WR);
                 }});
  all.push_back({"unknown type", "unknown message type 4242",
                 [=](int fd) { SendRaw(fd, RawFrame(HeaderFor(4242, payload), payload)); }});
  all.push_back({"declares 1 fd, sends 0", "frame declares 1 fds, 0 arrived", [=](int fd) {
                   SendRaw(fd, RawFrame(HeaderFor(kHeartbeatType, payload, 1), payload));
                 }});
  all.push_back({"declares 0 fds, sends 1", "frame declares 0 fds, 1 arrived",
                 [=](int fd) { SendRaw(fd, good, {spare_fd}); }});
  all.push_back({"bad version", "unsupported frame version 9", [=](int fd) {
                   FrameHeader h = HeaderFor(kHeartbeatType, payload);
                   h.version = 9;
                   SendRaw(fd, RawFrame(h, payload));
                 }});
  all.push_back({"malformed payload", "malformed Heartbeat payload", [=](int fd) {
                   const std::string bad = payload.substr(0, 5);
                   SendRaw(fd, RawFrame(HeaderFor(kHeartbeatType, bad), bad));
                 }});
  return all;
}

TEST(CorruptionTest, EveryCorruptFrameIsRefusedAndTheServerStaysUp) {
  testing::TempDir dir;
  const std::string path = dir.File("echo.sock");
  EchoServer server(path);
  boost::asio::io_context io;
  UniqueFd spare(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(spare.valid());

  // A well-behaved client stays connected throughout and must be unaffected.
  Result<Channel> bystander = Connect(io, path, ChannelOptions{.label = "echo"});
  ASSERT_TRUE(bystander.ok()) << bystander.status().ToString();
  ASSERT_TRUE(ClientHello(*bystander, ClientHelloOptions{.peer_name = "bystander"}).ok());

  const std::vector<Corruption> corruptions = AllCorruptions(spare.get());
  for (size_t i = 0; i < corruptions.size(); ++i) {
    const Corruption& c = corruptions[i];
    SCOPED_TRACE(c.name);
    Result<Channel> client = Connect(io, path, ChannelOptions{.label = "echo"});
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    ASSERT_TRUE(ClientHello(*client, ClientHelloOptions{.peer_name = c.name}).ok());
    c.send(client->native_handle());
    // The server says why, then closes.
    Result<ReceivedMessage> told = client->Receive(5s);
    ASSERT_TRUE(told.ok()) << told.status().ToString();
    ASSERT_EQ(told->type, MsgType::kErrorMsg);
    const std::string reason = told->As<ErrorMsg>()->message;
    EXPECT_NE(reason.find(c.expected_reason), std::string::npos) << reason;
    EXPECT_EQ(client->Receive(5s).status().code(), StatusCode::kUnavailable);
    const std::vector<std::string> refusals = server.WaitForRefusals(i + 1);
    ASSERT_EQ(refusals.size(), i + 1);
    EXPECT_EQ(refusals.back(), reason);
  }

  ASSERT_TRUE(bystander->Send(Heartbeat{.epoch = 2, .seq = 100}).ok());
  Result<ReceivedMessage> bystander_reply = bystander->Receive(5s);
  ASSERT_TRUE(bystander_reply.ok()) << bystander_reply.status().ToString();
  EXPECT_EQ(bystander_reply->As<Heartbeat>()->seq, 101u);

  // Still serving: a new client connects, says hello and gets heartbeats answered.
  Result<Channel> client = Connect(io, path, ChannelOptions{.label = "echo"});
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  Result<HelloAck> ack = ClientHello(*client, ClientHelloOptions{.peer_name = "good"});
  ASSERT_TRUE(ack.ok()) << ack.status().ToString();
  EXPECT_EQ(ack->server_name, "echo");
  for (uint64_t seq = 0; seq < 3; ++seq) {
    ASSERT_TRUE(client->Send(Heartbeat{.epoch = 2, .seq = seq * 10}).ok());
    Result<ReceivedMessage> reply = client->Receive(5s);
    ASSERT_TRUE(reply.ok()) << reply.status().ToString();
    EXPECT_EQ(reply->As<Heartbeat>()->seq, seq * 10 + 1);
  }
}

TEST(CorruptionTest, ABadHelloGetsAHelloReject) {
  testing::TempDir dir;
  const std::string path = dir.File("echo.sock");
  EchoServer server(path);
  boost::asio::io_context io;
  Result<Channel> client = Connect(io, path);
  ASSERT_TRUE(client.ok());
  const std::string garbage = "\x01\x05";
  SendRaw(client->native_handle(),
          RawFrame(HeaderFor(static_cast<uint16_t>(MsgType::kHello), garbage), garbage));
  Result<ReceivedMessage> reply = client->Receive(5s);
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  ASSERT_EQ(reply->type, MsgType::kHelloReject);
  EXPECT_NE(reply->As<HelloReject>()->reason.find("malformed Hello payload"), std::string::npos);
  EXPECT_EQ(server.WaitForRefusals(1).size(), 1u);
}

}  // namespace
}  // namespace baton::proto
