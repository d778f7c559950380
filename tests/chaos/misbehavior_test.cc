// Malformed, stale and unauthorized messages against a live controller: each is refused
// with a logged reason, the controller stays up, and the engine that did nothing wrong is
// unaffected (same pid, same epoch).
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>
#include <vector>

#include "proto/hello.h"
#include "proto/transport/listener.h"
#include "tests/chaos/chaos_harness.h"
#include "tests/chaos/misbehavior_support.h"
#include "tests/proto/proto_test_util.h"

namespace baton::chaos {
namespace {

// A connection to the controller past a Hello as `role` (the Hello's refusal, if refused).
Result<proto::Channel> ConnectAs(boost::asio::io_context& io, const ChaosCluster& cluster,
                                 proto::PeerRole role) {
  BATON_ASSIGN_OR_RETURN(proto::Channel channel, proto::Connect(io, cluster.socket()));
  BATON_RETURN_IF_ERROR(
      proto::ClientHello(channel, {.peer_name = "test", .role = role, .launch_token = ""})
          .status());
  return channel;
}

TEST(ChaosMisbehavior, GarbageOnTheSocketClosesOnlyThatConnection) {
  ChaosCluster cluster(TolerantHealth());
  const json before = cluster.Status();
  boost::asio::io_context io;
  Result<proto::Channel> raw = proto::Connect(io, cluster.socket());
  ASSERT_TRUE(raw.ok()) << raw.status().ToString();
  const char garbage[] = "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n";
  ASSERT_GT(::send(raw->native_handle(), garbage, sizeof(garbage) - 1, MSG_NOSIGNAL), 0);
  // The controller answers with an ErrorMsg naming the rule, then closes the connection.
  Result<proto::ReceivedMessage> reply = raw->Receive(std::chrono::seconds(5));
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  Result<proto::HelloAck> ack = reply->As<proto::HelloAck>();
  ASSERT_FALSE(ack.ok());
  EXPECT_NE(ack.status().message().find("bad frame magic"), std::string::npos)
      << ack.status().ToString();
  EXPECT_FALSE(raw->Receive(std::chrono::seconds(5)).ok()) << "the connection is closed";
  EXPECT_TRUE(cluster.ControllerAlive());
  ExpectPrimaryUnaffected(before, cluster.Status());
}

TEST(ChaosMisbehavior, WrongLaunchTokenIsRefused) {
  ChaosCluster cluster(TolerantHealth());
  const json before = cluster.Status();
  boost::asio::io_context io;
  Result<proto::Channel> raw = proto::Connect(io, cluster.socket());
  ASSERT_TRUE(raw.ok());
  proto::ClientHelloOptions hello{.peer_name = "impostor",
                                  .role = proto::PeerRole::kEngine,
                                  .launch_token = "0123456789abcdef0123456789abcdef"};
  Result<proto::HelloAck> ack = proto::ClientHello(*raw, hello);
  ASSERT_FALSE(ack.ok());
  EXPECT_NE(ack.status().message().find("wrong launch token"), std::string::npos)
      << ack.status().ToString();
  WaitRefusal(cluster, "wrong launch token");
  ExpectPrimaryUnaffected(before, cluster.Status());
}

TEST(ChaosMisbehavior, CliConnectionCannotRegister) {
  ChaosCluster cluster(TolerantHealth());
  boost::asio::io_context io;
  Result<proto::Channel> raw = ConnectAs(io, cluster, proto::PeerRole::kCli);
  ASSERT_TRUE(raw.ok()) << raw.status().ToString();
  ASSERT_TRUE(
      raw->Send(proto::Register{.engine_id = 1, .engine_version = "x", .http_address = ""}).ok());
  Result<proto::ReceivedMessage> reply = raw->Receive(std::chrono::seconds(5));
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  Result<proto::CtlReply> ctl = reply->As<proto::CtlReply>();
  ASSERT_TRUE(ctl.ok());
  EXPECT_EQ(ctl->exit_code, 2u);
  EXPECT_TRUE(cluster.ControllerAlive());
}

// Client connections are capped: past 256 open, the next client is told why and closed, so
// idle clients cannot take the file descriptors the engines' launches need. The pair serves
// on, and once clients go, new ones are served.
TEST(ChaosMisbehavior, ClientConnectionsAreCapped) {
  ChaosCluster cluster(TolerantHealth());
  const json before = cluster.Status();
  boost::asio::io_context io;
  std::vector<proto::Channel> held;
  for (int i = 0; i < 256; ++i) {
    Result<proto::Channel> cli = ConnectAs(io, cluster, proto::PeerRole::kCli);
    ASSERT_TRUE(cli.ok()) << i << ": " << cli.status().ToString();
    held.push_back(std::move(cli).value());
  }
  Result<proto::Channel> extra = ConnectAs(io, cluster, proto::PeerRole::kCli);
  ASSERT_TRUE(extra.ok()) << extra.status().ToString();
  Result<proto::ReceivedMessage> reply = extra->Receive(std::chrono::seconds(5));
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  Result<proto::CtlReply> refused = reply->As<proto::CtlReply>();
  ASSERT_TRUE(refused.ok());
  EXPECT_EQ(refused->exit_code, 1u);
  EXPECT_EQ(refused->text, "refused: 256 client connections are open");
  held.pop_back();  // one client leaves: the next is served (WaitFor's own status)
  const json after = cluster.WaitFor([](const json& s) { return !s.is_null(); }, "a status");
  ExpectPrimaryUnaffected(before, after);
  EXPECT_TRUE(cluster.ControllerAlive());
}

// Peer-supplied strings end up in status JSON; invalid UTF-8 there is replaced, not fatal.
TEST(ChaosMisbehavior, InvalidUtf8FromAPeerDoesNotStopTheController) {
  ChaosCluster cluster(TolerantHealth());
  const json before = cluster.Status();
  boost::asio::io_context io;
  Result<proto::Channel> raw = proto::Connect(io, cluster.socket());
  ASSERT_TRUE(raw.ok()) << raw.status().ToString();
  ASSERT_TRUE(raw->Send(proto::testing::RawHello{.peer_name = "test", .role = "\xfe"}).ok());
  Result<proto::ReceivedMessage> refused = raw->Receive(std::chrono::seconds(5));
  ASSERT_TRUE(refused.ok()) << refused.status().ToString();
  EXPECT_EQ(refused->type, proto::MsgType::kHelloReject);
  Result<proto::Channel> cli = ConnectAs(io, cluster, proto::PeerRole::kCli);
  ASSERT_TRUE(cli.ok()) << cli.status().ToString();
  ASSERT_TRUE(cli->Send(proto::CtlRequest{.command = "\xff", .args = {}}).ok());
  Result<proto::ReceivedMessage> reply = cli->Receive(std::chrono::seconds(5));
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  Result<proto::CtlReply> ctl = reply->As<proto::CtlReply>();
  ASSERT_TRUE(ctl.ok());
  EXPECT_EQ(ctl->exit_code, 2u);
  EXPECT_TRUE(json::accept(ctl->json)) << ctl->json;
  WaitRefusal(cluster, "unknown peer role");
  EXPECT_TRUE(cluster.ControllerAlive());
  ExpectPrimaryUnaffected(before, cluster.Status());
}

// A router connection that sends anything but Subscribe is told why and closed, so a peer
// that writes without reading cannot hold the controller's thread reply after reply.
TEST(ChaosMisbehavior, RouterConnectionSendingOtherMessagesIsClosed) {
  ChaosCluster cluster(TolerantHealth());
  const json before = cluster.Status();
  boost::asio::io_context io;
  Result<proto::Channel> router = ConnectAs(io, cluster, proto::PeerRole::kRouter);
  ASSERT_TRUE(router.ok()) << router.status().ToString();
  ASSERT_TRUE(router->Send(proto::Subscribe{.subscriber = "test"}).ok());
  Result<proto::ReceivedMessage> table = router->Receive(std::chrono::seconds(5));
  ASSERT_TRUE(table.ok()) << table.status().ToString();
  ASSERT_TRUE(table->As<proto::RouteTable>().ok());
  ASSERT_TRUE(router->Send(proto::Heartbeat{.epoch = 0, .seq = 1}).ok());
  Result<proto::ReceivedMessage> reply = router->Receive(std::chrono::seconds(5));
  while (reply.ok() && reply->type == proto::MsgType::kRouteTable) {  // tables published since
    reply = router->Receive(std::chrono::seconds(5));
  }
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_NE(reply->As<proto::RouteTable>().status().message().find("only sends Subscribe"),
            std::string::npos);
  EXPECT_FALSE(router->Receive(std::chrono::seconds(5)).ok()) << "the connection is closed";
  EXPECT_TRUE(cluster.ControllerAlive());
  ExpectPrimaryUnaffected(before, cluster.Status());
}

// An EngineStalled with no stream, or quieter than any router's stall timeout, is no
// evidence of a hang: refused, and the primary that answers is not fenced for it.
TEST(ChaosMisbehavior, AnImplausibleStallReportFencesNothing) {
  ChaosCluster cluster(TolerantHealth());
  const json before = cluster.Status();
  const uint64_t primary = EngineWithRole(before, "primary")["id"].get<uint64_t>();
  boost::asio::io_context io;
  Result<proto::Channel> router = ConnectAs(io, cluster, proto::PeerRole::kRouter);
  ASSERT_TRUE(router.ok()) << router.status().ToString();
  ASSERT_TRUE(router->Send(proto::Subscribe{.subscriber = "test"}).ok());
  ASSERT_TRUE(router->Receive(std::chrono::seconds(5)).ok());
  ASSERT_TRUE(router
                  ->Send(proto::EngineStalled{
                      .engine_id = primary, .streams = 0, .quiet_ms = 0, .router = "atk"})
                  .ok());
  ASSERT_TRUE(router
                  ->Send(proto::EngineStalled{
                      .engine_id = primary, .streams = 1, .quiet_ms = 1, .router = "atk"})
                  .ok());
  WaitRefusal(cluster, "with 0 streams quiet for 0 ms: no evidence of a hang");
  WaitRefusal(cluster, "with 1 streams quiet for 1 ms: no evidence of a hang");
  ExpectPrimaryUnaffected(before, cluster.Status());
  EXPECT_EQ(cluster.Status()["controller"]["failovers"], before["controller"]["failovers"]);
}

TEST(ChaosMisbehavior, StaleEpochIsRefusedAndTheSenderStopped) {
  ChaosCluster cluster(TolerantHealth());
  const json before = RogueStandby(cluster, "stale-epoch");
  WaitRefusal(cluster, "Heartbeat refused");
  const json after = cluster.WaitReady("a well-behaved standby again");
  ExpectPrimaryUnaffected(before, after);
  cluster.CheckFencing();
}

TEST(ChaosMisbehavior, ReturnOfABlockNotHeldIsRefused) {
  ChaosCluster cluster(TolerantHealth());
  const json before = RogueStandby(cluster, "foreign-return");
  WaitRefusal(cluster, "does not hold blocks");
  const json after = cluster.WaitReady();
  ExpectPrimaryUnaffected(before, after);
  // A refused request is not a protocol error: the sender stays connected.
  EXPECT_EQ(EngineWithRole(after, "standby")["version"], "rogue");
  EXPECT_EQ(after["pool"]["granted"], before["pool"]["granted"]) << "nothing was taken back";
  cluster.CheckFencing();
}

TEST(ChaosMisbehavior, LeaseRequestFromAStandbyIsRefused) {
  ChaosCluster cluster(TolerantHealth());
  const json before = RogueStandby(cluster, "foreign-lease");
  WaitRefusal(cluster, "maps nothing writable until promoted");
  const json after = cluster.WaitReady();
  ExpectPrimaryUnaffected(before, after);
  EXPECT_EQ(EngineWithRole(after, "standby")["blocks"], 0) << "a standby holds nothing";
  cluster.CheckFencing();
}

TEST(ChaosMisbehavior, BadFrameFromAnEngineFencesOnlyThatEngine) {
  ChaosCluster cluster(TolerantHealth());
  const json before = RogueStandby(cluster, "bad-frame");
  WaitRefusal(cluster, "protocol error");
  const json after = cluster.WaitFor(
      [&](const json& s) {
        const json sb = EngineWithRole(s, "standby");
        return IsReady(s) && sb["version"] != "rogue";
      },
      "the rogue standby to be replaced");
  ExpectPrimaryUnaffected(before, after);
  cluster.CheckFencing();
}

// Status once an engine other than `before`'s standby (the one RogueStandby killed) has
// exited with `needle` in its cause, and the pair is ready.
json WaitRogueExit(const ChaosCluster& cluster, const json& before, const std::string& needle,
                   const std::string& what) {
  const json killed = EngineWithRole(before, "standby")["pid"];
  return cluster.WaitFor(
      [&](const json& s) {
        for (const json& e : s["history"]["exits"]) {
          if (e["pid"] != killed &&
              e["cause"].get<std::string>().find(needle) != std::string::npos) {
            return IsReady(s);
          }
        }
        return false;
      },
      what);
}

// The thread holding the standby's liveness page ends while its process stays connected and
// beating: the controller fences it as dying at once (its connection never ended).
TEST(ChaosMisbehavior, AnEngineWhoseLivenessHolderDiesIsFencedWhileStillConnected) {
  ChaosCluster cluster(TolerantHealth());
  const json before = RogueStandby(cluster, "thread-dies");
  const json after = WaitRogueExit(cluster, before, "liveness page",
                                   "the rogue standby fenced as dying, and a ready pair");
  ExpectPrimaryUnaffected(before, after);
  EXPECT_NE(EngineWithRole(after, "standby")["version"], "rogue");
  cluster.CheckFencing();
}

// An ErrorReport sent just before the liveness page's holder dies is what the engine is
// fenced for: the death waits behind what the engine said before it.
TEST(ChaosMisbehavior, AnErrorReportedJustBeforeTheDeathIsHeardFirst) {
  ChaosCluster cluster(TolerantHealth());
  const json before = RogueStandby(cluster, "report-then-thread-dies");
  const json after =
      WaitRogueExit(cluster, before, "last words",
                    "the rogue standby fenced for its error report, and a ready pair");
  ExpectPrimaryUnaffected(before, after);
  cluster.CheckFencing();
}

TEST(ChaosMisbehavior, RegisterUnderAnotherEnginesIdIsRefused) {
  ChaosCluster cluster(TolerantHealth());
  const json before = RogueStandby(cluster, "wrong-id");
  WaitRefusal(cluster, "launch token belongs to engine");
  const json after = cluster.WaitReady("a well-behaved standby again");
  ExpectPrimaryUnaffected(before, after);
}

// What an engine registers goes into every route table the routers receive: a version of
// 600 KB (two such engines would exceed the router's frame limit and cut it off from route
// updates) or an address a router cannot dial is refused, and the engine replaced.
TEST(ChaosMisbehavior, RegisterWithAHugeVersionOrABadAddressIsRefused) {
  ChaosCluster cluster(TolerantHealth());
  const json before = RogueStandby(cluster, "huge-register");
  WaitRefusal(cluster, "engine_version is 600005 bytes");
  const json after = cluster.WaitReady("a well-behaved standby again");
  ExpectPrimaryUnaffected(before, after);
  RogueStandby(cluster, "bad-address");
  WaitRefusal(cluster, "http_address '127.0.0.1:99999'");
  cluster.WaitReady("a well-behaved standby again");
}

// An engine may not resize the shared memory nor write the weights: a truncated pool would
// take the pages from under the primary (SIGBUS), a written arena would corrupt the weights
// that the standby maps. The kernel refuses each attempt (memfd seals).
TEST(ChaosMisbehavior, AnEngineCannotResizeSharedMemoryNorWriteTheWeights) {
  ChaosCluster cluster(TolerantHealth());
  const json before = RogueStandby(cluster, "tamper-memory");
  const std::string report_glob = cluster.dir() + "/tamper-";
  std::string report;
  cluster.WaitFor(
      [&](const json&) {
        for (const auto& entry : std::filesystem::directory_iterator(cluster.dir())) {
          if (entry.path().string().rfind(report_glob, 0) != 0) continue;
          std::ifstream in(entry.path());
          report.assign(std::istreambuf_iterator<char>(in), {});
        }
        return std::count(report.begin(), report.end(), '\n') == 7;
      },
      "the tampering engine's report");
  EXPECT_EQ(report.find("succeeded"), std::string::npos) << report;
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the primary keeps stamping
  const json after = cluster.WaitReady();
  ExpectPrimaryUnaffected(before, after);
  cluster.CheckFencing();
}

// A client that sends requests and never reads the replies: the controller's sends never
// wait on it (its replies queue), and once it has taken nothing for a second it is dropped.
TEST(ChaosMisbehavior, AClientThatNeverReadsIsDroppedWithoutStallingTheController) {
  ChaosCluster cluster(TolerantHealth());
  const json before = cluster.Status();
  boost::asio::io_context io;
  Result<proto::Channel> cli = ConnectAs(io, cluster, proto::PeerRole::kCli);
  ASSERT_TRUE(cli.ok()) << cli.status().ToString();
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  Status sent = OkStatus();
  int requests = 0;
  while (sent.ok() && std::chrono::steady_clock::now() < give_up) {
    sent = cli->Send(proto::CtlRequest{.command = "status", .args = {}});
    ++requests;
    if (requests % 64 == 0) {
      // The pair is looked after meanwhile: batonctl gets its answers.
      EXPECT_EQ(cluster.Ctl({"status"}).exit_code, 0);
    }
  }
  EXPECT_FALSE(sent.ok()) << "the controller never dropped a client that reads nothing";
  cluster.WaitFor(
      [&](const json&) { return cluster.Log().find("bytes queued") != std::string::npos; },
      "the controller's reason for dropping the client (" + sent.ToString() + ")");
  EXPECT_TRUE(cluster.ControllerAlive());
  ExpectPrimaryUnaffected(before, cluster.Status());
}

TEST(ChaosMisbehavior, BatonctlUsageAndRefusals) {
  ChaosCluster cluster(TolerantHealth());
  const CtlResult unknown = cluster.Ctl({"frobnicate"});
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_EQ(unknown.out["ok"], false);  // --json: bad usage also ends with its JSON object
  const CtlResult huge = cluster.Ctl({"--timeout-ms", "3000000000", "status"});
  EXPECT_EQ(huge.exit_code, 2);
  EXPECT_NE(huge.out["error"].get<std::string>().find("--timeout-ms"), std::string::npos);
  EXPECT_EQ(cluster.Ctl({"drill"}).exit_code, 2);
  EXPECT_EQ(cluster.Ctl({"drill", "explode"}).exit_code, 2);
  const CtlResult help = cluster.Ctl({"--help"});  // Ctl passes --json
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_EQ(help.out["ok"], true) << help.stdout_text;
  EXPECT_NE(help.out["usage"].get<std::string>().find("--timeout-ms"), std::string::npos);
  const CtlResult status = cluster.Ctl({"status"});
  EXPECT_EQ(status.exit_code, 0);
  EXPECT_EQ(status.out["ok"], true);
  // A second switch-over while the first drains is refused with a reason.
  ASSERT_EQ(cluster.Ctl({"promote"}).exit_code, 0);
  const CtlResult again = cluster.Ctl({"promote"});
  if (again.exit_code != 0) {
    EXPECT_EQ(again.exit_code, 1);
    EXPECT_EQ(again.out["ok"], false);
    EXPECT_FALSE(again.out["error"].get<std::string>().empty());
  }
  cluster.WaitReady("the switch-over to finish");
}

}  // namespace
}  // namespace baton::chaos
