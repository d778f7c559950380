#include "proto/hello.h"

#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "proto/roles.h"
#include "tests/proto/proto_test_util.h"

namespace baton::proto {
namespace {

using namespace std::chrono_literals;

class HelloTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto pair = Channel::Pair(io_, ChannelOptions{.label = "hello"});
    ASSERT_TRUE(pair.ok());
    client_.emplace(std::move(pair->first));
    server_.emplace(std::move(pair->second));
  }

  // Runs ServerHello on a thread while the client says hello here.
  std::pair<Result<HelloAck>, Result<AcceptedHello>> Exchange(const ClientHelloOptions& client,
                                                              const ServerHelloOptions& server) {
    std::optional<Result<AcceptedHello>> accepted;
    std::thread t([&] { accepted.emplace(ServerHello(*server_, server)); });
    Result<HelloAck> ack = ClientHello(*client_, client);
    t.join();
    return {std::move(ack), std::move(*accepted)};
  }

  boost::asio::io_context io_;
  std::optional<Channel> client_, server_;
};

TEST_F(HelloTest, AgreesOnTheHighestCommonVersion) {
  auto [ack, accepted] =
      Exchange(ClientHelloOptions{.peer_name = "engine-a",
                                  .role = PeerRole::kEngine,
                                  .launch_token = "tok",
                                  .min_version = 1,
                                  .max_version = 5},
               ServerHelloOptions{.server_name = "controller", .min_version = 2, .max_version = 4});
  ASSERT_TRUE(ack.ok()) << ack.status().ToString();
  ASSERT_TRUE(accepted.ok()) << accepted.status().ToString();
  EXPECT_EQ(ack->version, 4);
  EXPECT_EQ(ack->server_name, "controller");
  EXPECT_EQ(accepted->version, 4);
  EXPECT_EQ(accepted->hello.peer_name, "engine-a");
  EXPECT_EQ(accepted->hello.role, PeerRole::kEngine);
  EXPECT_EQ(accepted->hello.launch_token, "tok");
  EXPECT_EQ(client_->version(), 4);
  EXPECT_EQ(server_->version(), 4);
  EXPECT_NE(server_->label().find("engine-a"), std::string::npos);
}

TEST_F(HelloTest, VersionMismatchIsRefusedWithAClearReason) {
  auto [ack, accepted] =
      Exchange(ClientHelloOptions{.peer_name = "new-engine",
                                  .role = PeerRole::kEngine,
                                  .launch_token = "",
                                  .min_version = 3,
                                  .max_version = 4},
               ServerHelloOptions{.server_name = "controller", .min_version = 1, .max_version = 1});
  const std::string reason = "protocol version mismatch: peer speaks 3..4, this side speaks 1..1";
  ASSERT_FALSE(accepted.ok());
  EXPECT_EQ(accepted.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(accepted.status().message(), reason);
  ASSERT_FALSE(ack.ok());
  EXPECT_EQ(ack.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(ack.status().message().find(reason), std::string::npos) << ack.status().message();
  EXPECT_FALSE(client_->is_open());
  EXPECT_FALSE(server_->is_open());
}

TEST_F(HelloTest, AdmissionCheckCanRefuse) {
  ServerHelloOptions server{.server_name = "controller"};
  server.admit = [](const Hello& hello) {
    return hello.launch_token == "right" ? OkStatus()
                                         : FailedPrecondition("launch token does not match");
  };
  auto [ack, accepted] = Exchange(
      ClientHelloOptions{
          .peer_name = "intruder", .role = PeerRole::kEngine, .launch_token = "wrong"},
      server);
  EXPECT_FALSE(accepted.ok());
  EXPECT_NE(ack.status().message().find("launch token does not match"), std::string::npos)
      << ack.status().message();
}

TEST_F(HelloTest, FirstMessageMustBeHello) {
  std::optional<Result<AcceptedHello>> accepted;
  std::thread t([&] { accepted.emplace(ServerHello(*server_, ServerHelloOptions{})); });
  ASSERT_TRUE(client_->Send(Heartbeat{.epoch = 1, .seq = 1}).ok());
  Result<ReceivedMessage> reply = client_->Receive(5s);
  t.join();
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  ASSERT_EQ(reply->type, MsgType::kHelloReject);
  EXPECT_EQ(reply->As<HelloReject>()->reason, "expected Hello as the first message, got Heartbeat");
  EXPECT_FALSE(accepted->ok());
}

// The role is text on the wire; one that names no role is refused at decode, with the reason.
TEST_F(HelloTest, AnUnknownRoleIsRefusedWithAClearReason) {
  std::optional<Result<AcceptedHello>> accepted;
  std::thread t([&] { accepted.emplace(ServerHello(*server_, ServerHelloOptions{})); });
  ASSERT_TRUE(client_->Send(testing::RawHello{.peer_name = "old", .role = "leader"}).ok());
  Result<ReceivedMessage> reply = client_->Receive(5s);
  t.join();
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  ASSERT_EQ(reply->type, MsgType::kHelloReject);
  const std::string reason = reply->As<HelloReject>()->reason;
  EXPECT_NE(reason.find("unknown peer role 'leader' (engine, cli, router, controller or drill)"),
            std::string::npos)
      << reason;
  ASSERT_FALSE(accepted->ok());
  EXPECT_EQ(accepted->status().code(), StatusCode::kFailedPrecondition);
  EXPECT_FALSE(server_->is_open());
}

// Every role crosses the wire as its name and reaches the server's admission check.
TEST_F(HelloTest, EveryRoleReachesTheServer) {
  for (PeerRole role : kPeerRoles) {
    Result<std::pair<Channel, Channel>> pair = Channel::Pair(io_);
    ASSERT_TRUE(pair.ok()) << pair.status().ToString();
    client_.emplace(std::move(pair->first));
    server_.emplace(std::move(pair->second));
    std::optional<PeerRole> seen;
    ServerHelloOptions server{.server_name = "controller"};
    server.admit = [&seen](const Hello& hello) {
      seen = hello.role;
      return OkStatus();
    };
    auto [ack, got] = Exchange(ClientHelloOptions{.peer_name = "p", .role = role}, server);
    ASSERT_TRUE(ack.ok()) << ToString(role) << ": " << ack.status().ToString();
    ASSERT_TRUE(got.ok()) << ToString(role) << ": " << got.status().ToString();
    EXPECT_EQ(got->hello.role, role);
    EXPECT_EQ(seen, role);
  }
}

TEST_F(HelloTest, ClientTimesOutOnASilentServer) {
  Result<HelloAck> ack = ClientHello(*client_, ClientHelloOptions{.timeout = 20ms});
  EXPECT_EQ(ack.status().code(), StatusCode::kDeadlineExceeded);
}

TEST(NegotiateVersionTest, Ranges) {
  EXPECT_EQ(*NegotiateVersion(1, 1, 1, 1), 1);
  EXPECT_EQ(*NegotiateVersion(1, 9, 3, 5), 5);
  EXPECT_EQ(*NegotiateVersion(4, 9, 3, 5), 5);
  EXPECT_EQ(*NegotiateVersion(1, 3, 3, 5), 3);
  EXPECT_FALSE(NegotiateVersion(6, 9, 3, 5).ok());
  EXPECT_FALSE(NegotiateVersion(1, 2, 3, 5).ok());
  EXPECT_NE(NegotiateVersion(5, 4, 1, 9).status().message().find("range 5..4 is empty"),
            std::string::npos);
}

}  // namespace
}  // namespace baton::proto
