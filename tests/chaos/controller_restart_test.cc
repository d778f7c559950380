// The controller outlives itself: kill -9 of baton-controller (at random, or at a failpoint
// in the middle of a fence, a promotion, a barrier, a journal write, an upgrade step, its own
// recovery) leaves the engines serving and the weights and the pool in baton-keeper; the
// next controller re-adopts what it can account for and fences the rest. Real processes, real
// kill -9; every check goes through batonctl.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <thread>

#include "base/io/unique_fd.h"
#include "base/process/proc_table.h"
#include "controller/keeper/keeper_client.h"
#include "proto/hello.h"
#include "proto/transport/listener.h"
#include "tests/chaos/chaos_harness.h"
#include "tests/chaos/controller_restart_support.h"

namespace baton::chaos {
namespace {

TEST(ControllerRestart, EnginesWeightsAndPoolSurviveKillMinusNine) {
  ChaosCluster cluster;
  const json before = cluster.Status();
  const json primary = EngineWithRole(before, "primary");
  for (const json& e : before["engines"]) EXPECT_EQ(e["liveness"], "watched") << e.dump();
  cluster.KillController();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  for (pid_t pid : EnginePids(before)) {
    EXPECT_TRUE(ProcessExists(pid)) << "engine pid " << pid << " died with its controller";
  }
  EXPECT_GT(cluster.KeeperPid(), 0) << "baton-keeper holds the memory meanwhile";
  cluster.RestartController();
  const json after = cluster.WaitFor([&](const json& s) { return SamePair(before, s); },
                                     "the same pair, re-adopted");
  const json& recovery = after["controller"]["recovery"];
  EXPECT_TRUE(recovery["restarted"].get<bool>());
  EXPECT_FALSE(recovery["in_progress"].get<bool>());
  EXPECT_EQ(recovery["readopted"].size(), 2u) << recovery.dump();
  EXPECT_TRUE(recovery["fenced"].empty()) << recovery.dump();
  EXPECT_TRUE(recovery["readopt_ms"].is_number()) << recovery.dump();
  EXPECT_EQ(after["controller"]["restarts"], 1);
  ExpectAdoptedMemory(after);
  EXPECT_EQ(EngineWithRole(after, "primary")["epoch"], primary["epoch"])
      << "the primary keeps its epoch and its blocks";
  EXPECT_EQ(EngineWithRole(after, "primary")["blocks"], primary["blocks"]);
  EXPECT_TRUE(EngineWithRole(after, "primary")["adopted"].get<bool>());
  EXPECT_NE(cluster.Log().find("re-adopted as serving"), std::string::npos) << cluster.Log();
  for (const json& e : after["engines"]) {
    EXPECT_EQ(e["liveness"], "watched") << "its Reattach carried its liveness page: " << e.dump();
  }
  ExpectHealthy(cluster, after);
  // Epochs never repeat: the next failover uses one above everything issued before.
  ASSERT_EQ(cluster.Ctl({"drill", "kill"}).exit_code, 0);
  const json failed_over = cluster.WaitFor(
      [&](const json& s) { return IsReady(s) && PrimaryId(s) != PrimaryId(before); },
      "a failover after the restart");
  EXPECT_GT(Epoch(failed_over), Epoch(before));
  ExpectHealthy(cluster, failed_over);
}

// A weight arena with one huge page (model.max_huge_pages = 1) and 4 KiB pages for the rest:
// the engines map its two memfds back to back, baton-keeper keeps both, and a controller
// restarted after kill -9 adopts it whole, with the same engines; a standby launched after
// that maps it too.
TEST(ControllerRestart, APartialHugePageArenaIsKeptAndAdopted) {
  if (HugePagesFree() < 4) {
    GTEST_SKIP() << "needs free 2 MiB huge pages (HugePages_Free is " << HugePagesFree() << ")";
  }
  ClusterOptions options;
  options.model_dir = FiveMiBModelDir();
  options.weights_max_huge_pages = 1;
  ChaosCluster cluster(options);
  const json before = cluster.Status();
  ASSERT_EQ(before["weights"]["huge_bytes"], 2u << 20) << before["weights"].dump();
  const uint64_t small = before["weights"]["small_bytes"].get<uint64_t>();
  ASSERT_GT(small, 0u) << before["weights"].dump();
  EXPECT_NE(cluster.Log().find("partial huge pages: 2097152 bytes on 2 MiB pages"),
            std::string::npos)
      << cluster.Log();
  const CtlResult text = cluster.CtlPlain({"status"});
  EXPECT_NE(text.stdout_text.find("partial huge pages (2097152 B on 2 MiB pages, " +
                                  std::to_string(small) + " B on 4 KiB pages)"),
            std::string::npos)
      << text.stdout_text;

  cluster.KillController();
  cluster.RestartController();
  const json after = cluster.WaitFor([&](const json& s) { return SamePair(before, s); },
                                     "the same pair, re-adopted");
  ExpectAdoptedMemory(after);
  EXPECT_EQ(after["weights"]["huge_bytes"], 2u << 20) << after["weights"].dump();
  EXPECT_EQ(after["weights"]["small_bytes"], small) << after["weights"].dump();
  ExpectHealthy(cluster, after);
  ASSERT_EQ(cluster.Ctl({"drill", "kill"}).exit_code, 0);
  const json failed_over = cluster.WaitFor(
      [&](const json& s) { return IsReady(s) && PrimaryId(s) != PrimaryId(before); },
      "a failover, then a new standby on the adopted partial arena");
  ExpectHealthy(cluster, failed_over);
}

// baton-keeper closes a connection left idle for its idle timeout (10 s), and the controller
// holds one across its weight load: a load that takes longer (a 4.3 GB model on 4 KiB pages
// under load) found the connection closed when it came to keep the memory, kept nothing, and
// the next controller loaded the model again and replaced the engines. Here the keeper closes
// a connection idle for 20 ms, and the first controller pre-faults a 1 GiB pool (zeroing a
// GiB takes longer than that, huge pages or not) between asking the keeper for a kept pool
// and keeping its memory there.
TEST(ControllerRestart, MemoryIsKeptWhenTheKeeperClosedTheConnectionDuringTheLoad) {
  ClusterOptions options;
  options.blocks = 1024;
  options.block_bytes = 1 << 20;
  options.controller_env = {"BATON_KEEPER_IDLE_TIMEOUT_MS=20"};  // the keeper inherits it
  ChaosCluster cluster(options);
  const json before = cluster.Status();
  EXPECT_EQ(before["controller"]["keeper"]["state"], "keeping") << before["controller"].dump();
  cluster.KillController();
  cluster.RestartController();
  const json after = cluster.WaitFor([&](const json& s) { return SamePair(before, s); },
                                     "the same pair, re-adopted");
  ExpectAdoptedMemory(after);
  EXPECT_TRUE(after["controller"]["recovery"]["fenced"].empty()) << after["controller"].dump();
  EXPECT_NE(cluster.Log().find("the connection to baton-keeper is closed"), std::string::npos)
      << "the keeper did close an idle connection: " << cluster.Log();
  ExpectHealthy(cluster, after);
}

TEST(ControllerRestart, BatonctlControllerRestartHandsOver) {
  ChaosCluster cluster;
  const json before = cluster.Status();
  const CtlResult r = cluster.Ctl({"controller", "restart"});
  EXPECT_EQ(r.exit_code, 0) << r.stdout_text;
  const int status = cluster.WaitControllerExit();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  cluster.RestartController();
  const json after = cluster.WaitFor([&](const json& s) { return SamePair(before, s); },
                                     "the same pair after a hand-over");
  ExpectAdoptedMemory(after);
  ExpectHealthy(cluster, after);
}

TEST(ControllerRestart, APrimaryKilledWhileNoControllerRunsIsFencedAndTheStandbyPromoted) {
  ChaosCluster cluster;
  const json before = cluster.Status();
  const json primary = EngineWithRole(before, "primary");
  const json standby = EngineWithRole(before, "standby");
  cluster.KillController();
  ASSERT_EQ(::kill(PidOf(primary), SIGKILL), 0);
  cluster.RestartController();
  const json after =
      cluster.WaitFor([&](const json& s) { return IsReady(s) && PrimaryId(s) == standby["id"]; },
                      "the re-adopted standby to take over");
  EXPECT_GT(Epoch(after), Epoch(before));
  EXPECT_TRUE(EngineWithRole(after, "primary")["adopted"].get<bool>());
  ExpectAdoptedMemory(after);
  // Status says what became of the dead primary: gone, not fenced as unaccounted for.
  const json& recovery = after["controller"]["recovery"];
  ASSERT_EQ(recovery["gone"].size(), 1u) << recovery.dump();
  EXPECT_EQ(recovery["gone"][0]["id"], primary["id"]);
  EXPECT_EQ(recovery["gone"][0]["reason"], "exited while no controller ran");
  EXPECT_TRUE(recovery["fenced"].empty()) << recovery.dump();
  const std::string text = cluster.CtlPlain({"status"}).stdout_text;
  EXPECT_NE(text.find("fenced 0, gone 1, weights and pool adopted"), std::string::npos) << text;
  EXPECT_NE(text.find("gone at restart: engine " + primary["id"].dump() +
                      ": exited while no controller ran"),
            std::string::npos)
      << text;
  ExpectHealthy(cluster, after);
}

TEST(ControllerRestart, ControllerAndPrimaryKilledTogether) {
  ChaosCluster cluster;
  const json before = cluster.Status();
  const json primary = EngineWithRole(before, "primary");
  const json standby = EngineWithRole(before, "standby");
  ::kill(PidOf(primary), SIGKILL);
  cluster.KillController();
  cluster.RestartController();
  const json after =
      cluster.WaitFor([&](const json& s) { return IsReady(s) && PrimaryId(s) == standby["id"]; },
                      "the standby to take over");
  ExpectHealthy(cluster, after);
}

TEST(ControllerRestart, AStandbyThatHangsAcrossTheRestartIsFencedAndReplaced) {
  ClusterOptions options;
  options.readopt_timeout_ms = 2000;  // the live primary reattaches well within it
  ChaosCluster cluster(options);
  const json before = cluster.Status();
  const json standby = EngineWithRole(before, "standby");
  cluster.KillController();
  ASSERT_EQ(::kill(PidOf(standby), SIGSTOP), 0);
  cluster.RestartController();
  const json after = cluster.WaitFor(
      [&](const json& s) {
        return IsReady(s) && PrimaryId(s) == PrimaryId(before) &&
               EngineWithRole(s, "standby")["id"] != standby["id"];
      },
      "a new standby in place of the silent one");
  const json& fenced = after["controller"]["recovery"]["fenced"];
  ASSERT_EQ(fenced.size(), 1u) << after["controller"].dump();
  EXPECT_EQ(fenced[0]["id"], standby["id"]);
  EXPECT_NE(fenced[0]["reason"].get<std::string>().find("did not register again"),
            std::string::npos);
  EXPECT_FALSE(ProcessRunning(PidOf(standby))) << "the silent standby was killed";
  ExpectHealthy(cluster, after);
}

// An engine frozen before its controller dies: the controller's death orphans its process
// group, and the kernel ends it (SIGHUP); the next controller counts it gone and replaces it,
// the primary re-adopted.
TEST(ControllerRestart, AnEngineFrozenBeforeItsControllerDiesIsReplaced) {
  ClusterOptions options;
  options.readopt_timeout_ms = 2000;  // the live primary reattaches well within it
  ChaosCluster cluster(options);
  const json before = cluster.Status();
  const pid_t standby = PidOf(EngineWithRole(before, "standby"));
  ASSERT_EQ(::kill(standby, SIGSTOP), 0);
  cluster.KillController();
  cluster.RestartController();
  const json after = cluster.WaitFor(
      [&](const json& s) {
        return IsReady(s) && PrimaryId(s) == PrimaryId(before) && EnginePids(s).count(standby) == 0;
      },
      "a new standby in place of the frozen one");
  EXPECT_EQ(after["controller"]["recovery"]["readopted"].size(), 1u) << after["controller"].dump();
  EXPECT_FALSE(ProcessRunning(standby));
  ExpectHealthy(cluster, after);
}

// A process that connects while no controller listens, with a token of its own making: the
// restarted controller refuses it and keeps its own engines.
TEST(ControllerRestart, AStrangerWaitingForTheControllerIsRefused) {
  ChaosCluster cluster;
  const json before = cluster.Status();
  cluster.KillController();
  std::atomic<bool> refused{false};
  std::thread stranger([&] {
    // Until refused, however long the restarted controller takes to listen.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!refused && std::chrono::steady_clock::now() < deadline) {
      boost::asio::io_context io;
      Result<proto::Channel> c = proto::Connect(io, cluster.socket());
      if (c.ok()) {
        Result<proto::HelloAck> ack =
            proto::ClientHello(*c, {.peer_name = "stranger",
                                    .role = proto::PeerRole::kEngine,
                                    .launch_token = "00112233445566778899"});
        refused =
            !ack.ok() && ack.status().message().find("wrong launch token") != std::string::npos;
        if (refused) return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  cluster.RestartController();
  stranger.join();
  EXPECT_TRUE(refused.load()) << "the stranger was not refused";
  const json after = cluster.WaitFor([&](const json& s) { return SamePair(before, s); },
                                     "the same pair, the stranger refused");
  ExpectHealthy(cluster, after);
}

// An upgrade in flight in its canary phase.
bool CanaryPhase(const json& s) {
  const json& current = s["upgrade"]["current"];
  return current.is_object() && current["phase"] == "canary";
}

// `batonctl upgrade` to a canary of the engines' own command, with steps too long to pass.
std::vector<std::string> SameCommandUpgrade(const ChaosCluster& cluster) {
  std::vector<std::string> args = {"upgrade", "--steps", "50,100", "--step-ms", "600000", "--"};
  const json status = cluster.Status();
  for (const json& part : status["upgrade"]["active_command"]) {
    args.push_back(part.get<std::string>());
  }
  return args;
}

// Another process holds the metrics port when the controller comes back: it says so and exits
// before it touches the pair (the port is bound before anything is re-adopted), the engines
// keep serving, and the next controller, the port free again, re-adopts the same pair.
TEST(ControllerRestart, AMetricsPortTakenAtTheRestartTouchesNoEngine) {
  ClusterOptions options;
  options.metrics_port = FreeTcpPort();
  ASSERT_GT(options.metrics_port, 0);
  ChaosCluster cluster(options);
  const json before = cluster.Status();
  cluster.KillController();
  {
    UniqueFd taken(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in at{};
    at.sin_family = AF_INET;
    at.sin_port = htons(static_cast<uint16_t>(options.metrics_port));
    at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::bind(taken.get(), reinterpret_cast<sockaddr*>(&at), sizeof(at)), 0);
    ASSERT_EQ(::listen(taken.get(), 1), 0);
    cluster.StartControllerAgain();
    const int status = cluster.WaitControllerExit();
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << "status " << status;
    EXPECT_NE(cluster.Log().find("cannot start"), std::string::npos) << cluster.Log();
    for (pid_t pid : EnginePids(before)) EXPECT_TRUE(ProcessExists(pid)) << "engine " << pid;
  }
  cluster.StartControllerAgain();
  const json after = cluster.WaitFor([&](const json& s) { return SamePair(before, s); },
                                     "the same pair, re-adopted");
  ExpectHealthy(cluster, after);
}

// The controller dies exactly at a failpoint; the next one (without failpoints) brings the
// pair back, and the fencing rules hold.
struct FailpointCase {
  const char* failpoint;
  // What makes the controller pass the failpoint once it runs with it.
  enum class Trigger {
    kDrillKill,  // batonctl drill kill
    kPromote,    // batonctl promote
    kStart,      // the first start
    kRestart,    // a restart that re-adopts
    kJournal,    // a failover that writes the journal (epoch_reserve = 1)
    kUpgrade,    // batonctl upgrade to a canary of the same command
    kRollback,   // an upgrade, then batonctl rollback once the canary serves
  } trigger;
};

class ControllerKilledAtAFailpoint : public ::testing::TestWithParam<FailpointCase> {};

TEST_P(ControllerKilledAtAFailpoint, TheNextControllerBringsThePairBack) {
  const FailpointCase& c = GetParam();
  ClusterOptions options;
  options.readopt_timeout_ms = 1000;
  if (c.trigger == FailpointCase::Trigger::kJournal) options.epoch_reserve = 1;
  const std::string env = std::string("BATON_FAILPOINTS=") + c.failpoint;
  if (c.trigger == FailpointCase::Trigger::kStart) {
    options.controller_env = {env};
    options.wait_ready = false;
  }
  ChaosCluster cluster(options);
  if (c.trigger == FailpointCase::Trigger::kRestart) {
    cluster.WaitReady("the first pair");
    cluster.KillController();
    cluster.StartControllerAgain({env});  // it dies while re-adopting
  } else if (c.trigger != FailpointCase::Trigger::kStart) {
    cluster.WaitReady("the first pair");
    cluster.KillController();
    cluster.StartControllerAgain({env});  // the same engines, under a controller that dies
    cluster.WaitReady("the pair under the controller with the failpoint");
    const CtlResult r = c.trigger == FailpointCase::Trigger::kPromote ? cluster.Ctl({"promote"})
                        : c.trigger == FailpointCase::Trigger::kUpgrade ||
                                c.trigger == FailpointCase::Trigger::kRollback
                            ? cluster.Ctl(SameCommandUpgrade(cluster))
                            : cluster.Ctl({"drill", "kill"});
    EXPECT_NE(r.exit_code, 2) << r.stdout_text;
    if (c.trigger == FailpointCase::Trigger::kRollback) {
      cluster.WaitFor(CanaryPhase, "the canary serves");
      EXPECT_EQ(cluster.Ctl({"rollback"}).exit_code, 0);
    }
  }
  const int status = cluster.WaitControllerExit();
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
      << "the controller did not die at " << c.failpoint << " (status " << status << ")\n"
      << cluster.Log();
  EXPECT_NE(cluster.Log().find(std::string("failpoint ") + c.failpoint + ": dying here"),
            std::string::npos);
  cluster.StartControllerAgain();
  // Ready, or serving a resumed canary next to its primary.
  const json after = cluster.WaitFor(
      [](const json& s) {
        return !s["controller"]["recovery"]["in_progress"].get<bool>() &&
               (IsReady(s) || (CanaryPhase(s) && !EngineWithRole(s, "canary").is_null()));
      },
      "the pair after dying at the failpoint");
  ExpectHealthy(cluster, after);
}

INSTANTIATE_TEST_SUITE_P(
    Failpoints, ControllerKilledAtAFailpoint,
    ::testing::Values(FailpointCase{"after_fence", FailpointCase::Trigger::kDrillKill},
                      FailpointCase{"before_promote", FailpointCase::Trigger::kDrillKill},
                      FailpointCase{"after_promote", FailpointCase::Trigger::kDrillKill},
                      FailpointCase{"mid_barrier", FailpointCase::Trigger::kDrillKill},
                      FailpointCase{"mid_journal_write", FailpointCase::Trigger::kJournal},
                      FailpointCase{"mid_switchover", FailpointCase::Trigger::kPromote},
                      FailpointCase{"after_launch", FailpointCase::Trigger::kStart},
                      FailpointCase{"mid_recovery", FailpointCase::Trigger::kRestart},
                      FailpointCase{"canary_promoting", FailpointCase::Trigger::kUpgrade},
                      FailpointCase{"mid_upgrade_step", FailpointCase::Trigger::kUpgrade},
                      FailpointCase{"after_grant", FailpointCase::Trigger::kRollback}),
    [](const ::testing::TestParamInfo<FailpointCase>& info) {
      return std::string(info.param.failpoint);
    });

}  // namespace
}  // namespace baton::chaos
