// Who may speak to the controller, checked against the process behind each Hello
// (controller/engines/peer_origin.h): code inside an engine may not command the controller,
// and an engine's launch token is taken only from that engine's processes. The suites keep
// the ChaosMisbehavior name of the misbehaving-peer tests.
#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "proto/hello.h"
#include "proto/transport/listener.h"
#include "tests/chaos/chaos_harness.h"
#include "tests/chaos/misbehavior_support.h"

namespace baton::chaos {
namespace {

// Code inside an engine may not command the controller: the engine's own connections as
// batonctl and as a router, batonctl run by a worker that left the engine's process group,
// and a Hello over a connection that a child made and left behind when it exited, are
// refused, and the pair stays in service. With cgroups, the cgroup tells; without, the
// process group and the descent from the engine.
class ChaosEngineCommands : public ::testing::TestWithParam<std::string> {};

TEST_P(ChaosEngineCommands, AreRefused) {
  ClusterOptions options = TolerantHealth();
  options.engine_cgroup = GetParam();
  ChaosCluster cluster(options);
  const json before = RogueStandby(cluster, "command-controller");
  const std::string path = WaitFileNamed(cluster, "command-");
  const std::string id = path.substr(path.rfind('-') + 1, path.size() - path.rfind('-') - 5);
  std::ifstream in(path);
  const std::string report(std::istreambuf_iterator<char>(in), {});
  EXPECT_EQ(report.find(": served\n"), std::string::npos) << report;
  // "auto" falls back to process groups where this machine gives no engine cgroups.
  const bool by_cgroup = before["fencing"]["by"] == "cgroup";
  if (GetParam() == "off") {
    EXPECT_FALSE(by_cgroup) << before["fencing"].dump();
  }
  const std::string rule = by_cgroup ? "cgroup" : "process group";
  EXPECT_NE(report.find("role 'cli' from pid"), std::string::npos) << report;
  EXPECT_NE(report.find("role 'router' from pid"), std::string::npos) << report;
  EXPECT_NE(report.find("a process of engine " + id + " (" + rule + ")"), std::string::npos)
      << report;
  const std::string worker_rule = by_cgroup ? "cgroup" : "descendant";
  EXPECT_NE(report.find("batonctl drain from a worker: exit 1: "), std::string::npos) << report;
  EXPECT_NE(report.find("(" + worker_rule + "): an engine may not command the controller"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("cli through a process that is gone: refused (hello refused by unix "
                        "peer: role 'cli' from pid"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find(", which is gone: a Hello is served only while the process that "
                        "connected runs)"),
            std::string::npos)
      << report;
  WaitRefusal(cluster, "a process of engine " + id);
  const json after = cluster.Status();
  EXPECT_EQ(after["pair"]["state"], before["pair"]["state"]) << "no drain: " << after.dump(2);
  ExpectPrimaryUnaffected(before, after);
  cluster.CheckFencing();
}

INSTANTIATE_TEST_SUITE_P(ChaosMisbehavior, ChaosEngineCommands, ::testing::Values("auto", "off"),
                         [](const auto& info) {
                           return info.param == "off" ? std::string("WithoutCgroups")
                                                      : std::string("WithCgroups");
                         });

// A launch token is taken only from a process of its engine: the token read from the engine
// (as any process of the same user can, from /proc/PID/environ) is refused from elsewhere,
// and the engine itself registers with it afterwards.
TEST(ChaosMisbehavior, ALaunchTokenIsTakenOnlyFromItsEngine) {
  ChaosCluster cluster(TolerantHealth());
  const json before = RogueStandby(cluster, "lend-token");
  const std::string token_file = WaitFileNamed(cluster, "token-");
  pid_t lender = 0;
  std::string token;
  std::ifstream(token_file) >> lender >> token;
  boost::asio::io_context io;
  Result<proto::Channel> raw = proto::Connect(io, cluster.socket());
  ASSERT_TRUE(raw.ok()) << raw.status().ToString();
  Result<proto::HelloAck> ack = proto::ClientHello(
      *raw, {.peer_name = "thief", .role = proto::PeerRole::kEngine, .launch_token = token});
  ASSERT_FALSE(ack.ok()) << "a stolen token was taken";
  EXPECT_NE(ack.status().message().find("which is not a process of engine"), std::string::npos)
      << ack.status().ToString();
  std::filesystem::remove(token_file);
  const json after =
      cluster.WaitFor([&](const json& s) { return PidOf(EngineWithRole(s, "standby")) == lender; },
                      "the lender registered as the standby");
  ExpectPrimaryUnaffected(before, after);
}

}  // namespace
}  // namespace baton::chaos
