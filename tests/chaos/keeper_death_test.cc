// baton-keeper may die (kill -9, the OOM killer): the controller still holds every fd of the
// memory, starts a new keeper and hands it the memory again, and rewrites the memory record,
// so that a later kill -9 of the controller is survived as before: the same engine processes,
// nothing loaded from disk again, no request lost. Real processes, real kill -9, load through
// baton-router.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>

#include <chrono>
#include <fstream>
#include <set>
#include <thread>

#include "base/io/unique_fd.h"
#include "base/process/pidfd.h"
#include "base/process/proc_table.h"
#include "tests/chaos/chaos_harness.h"
#include "tests/chaos/router_load.h"
#include "tests/support/silent_listener.h"

namespace baton::chaos {
namespace {

using std::chrono::milliseconds;

std::set<pid_t> EnginePids(const json& status) {
  std::set<pid_t> pids;
  for (const json& e : status["engines"]) pids.insert(PidOf(e));
  return pids;
}

const json& Keeper(const json& status) { return status["controller"]["keeper"]; }

// Whether `pid` has stopped running within `limit`. Its zombie counts as ended: the keeper is
// a child of a controller that may be gone, and its reaper may take long to reap it.
bool EndsWithin(pid_t pid, milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (ProcessRunning(pid)) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(20));
  }
  return true;
}

// A new keeper, not `dead`, keeps the memory after `restarts` deaths.
bool KeptAgain(const json& s, pid_t dead, int restarts) {
  const json& k = Keeper(s);
  return k.value("state", "") == "keeping" && k.value("pid", 0) > 0 && k.value("pid", 0) != dead &&
         k.value("restarts", 0) == restarts;
}

// kill -9 of the controller and a restart: the engines of `cold` are re-adopted, with the
// memory the keeper kept.
void ExpectTheNextRestartReadopts(ChaosCluster& cluster, const json& cold) {
  cluster.KillController();
  cluster.RestartController();
  const json warm = cluster.WaitFor(
      [&](const json& s) { return IsReady(s) && EnginePids(s) == EnginePids(cold); },
      "the same engines, re-adopted");
  EXPECT_EQ(warm["controller"]["recovery"]["memory"], "adopted") << warm["controller"].dump();
  EXPECT_TRUE(warm["controller"]["recovery"]["fenced"].empty()) << warm["controller"].dump();
  cluster.CheckFencing();
}

TEST(KeeperDeath, KeeperThenControllerKilledUnderLoadLosesNothing) {
  ClusterOptions options = TolerantHealth(RefenginePair());  // no failover may come of the load
  options.metrics_port = FreePort();
  ChaosCluster cluster(options);
  RouterProcess router(cluster.socket(), cluster.dir());
  ASSERT_TRUE(router.ready()) << router.Log();
  std::vector<json> requests;
  std::vector<StreamOutput> want;
  References(router.port(), "Keeper death", 48, &requests, &want);
  const json before = cluster.Status();
  ASSERT_EQ(Keeper(before)["state"], "keeping") << before["controller"].dump();
  const pid_t keeper = cluster.KeeperPid();
  ASSERT_GT(keeper, 0);
  ASSERT_EQ(Keeper(before)["pid"], keeper);

  const LoadResult r = LoadAround(router.port(), requests, want, [&] {
    ASSERT_EQ(::kill(keeper, SIGKILL), 0);
    cluster.WaitFor([&](const json& s) { return KeptAgain(s, keeper, 1); },
                    "a new baton-keeper keeping the memory");
    cluster.KillController();
    std::this_thread::sleep_for(milliseconds(300));
    cluster.RestartController();
  });
  ExpectNoFailure(r, router);

  const json after = cluster.WaitFor(
      [&](const json& s) { return IsReady(s) && EnginePids(s) == EnginePids(before); },
      "the same engines, re-adopted");
  EXPECT_EQ(EnginePids(after), EnginePids(before)) << "no engine replaced";
  const json& recovery = after["controller"]["recovery"];
  EXPECT_EQ(recovery["memory"], "adopted") << recovery.dump();
  EXPECT_TRUE(recovery["fenced"].empty()) << recovery.dump();
  EXPECT_EQ(after["weights"]["load_method"], "adopted") << after["weights"].dump();
  EXPECT_EQ(after["weights"]["bytes_read"], 0) << "nothing loaded from disk again";
  EXPECT_TRUE(after["pool"]["adopted"].get<bool>()) << after["pool"].dump();
  EXPECT_EQ(after["invariants"], "ok");
  EXPECT_NE(cluster.KeeperPid(), keeper);
  EXPECT_EQ(Keeper(after)["state"], "keeping") << after["controller"].dump();
  cluster.CheckFencing();
  const std::string log = cluster.Log();
  EXPECT_NE(log.find("baton-keeper restarting (pid " + std::to_string(keeper) + ")"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("the memory is kept again by baton-keeper"), std::string::npos) << log;
}

TEST(KeeperDeath, EveryDeathIsCountedAndShown) {
  ClusterOptions options;
  options.metrics_port = FreePort();
  ChaosCluster cluster(options);
  for (int k = 1; k <= 2; ++k) {
    const pid_t keeper = cluster.KeeperPid();
    ASSERT_GT(keeper, 0);
    ASSERT_EQ(::kill(keeper, SIGKILL), 0);
    cluster.WaitFor([&](const json& s) { return KeptAgain(s, keeper, k); },
                    "baton-keeper started again after death " + std::to_string(k));
  }
  EXPECT_EQ(MetricValue(options.metrics_port, "baton_keeper_restarts_total"), 2);
  EXPECT_EQ(MetricValue(options.metrics_port, "baton_keeper_state{state=\"keeping\"}"), 1);
  const CtlResult plain = cluster.CtlPlain({"status"});
  EXPECT_NE(plain.stdout_text.find("keeper: keeping"), std::string::npos) << plain.stdout_text;
  // A clean stop still lets the last keeper go (the harness checks that none outlives it).
  EXPECT_EQ(cluster.StopController(), 0);
}

// A keeper frozen (SIGSTOP) across a controller restart: the new controller finds it hung
// (no answer within a second), kills it and starts another; what the frozen one kept cannot
// be had, so this restart is cold (a new pair), but the new keeper keeps this controller's
// memory at once and the record names it, so the next restart re-adopts the same engines.
TEST(KeeperDeath, AFrozenKeeperIsReplacedAndTheNextRestartIsWarm) {
  ChaosCluster cluster;
  const pid_t frozen = cluster.KeeperPid();
  ASSERT_GT(frozen, 0);
  ASSERT_EQ(::kill(frozen, SIGSTOP), 0);
  cluster.KillController();
  cluster.RestartController();
  const json cold =
      cluster.WaitFor([&](const json& s) { return IsReady(s) && KeptAgain(s, frozen, 0); },
                      "a pair, and a new keeper keeping its memory");
  std::string log = cluster.Log();
  EXPECT_NE(log.find("baton-keeper (pid " + std::to_string(frozen) + ") at " + cluster.dir() +
                     "/run/keeper.sock accepted but did not answer"),
            std::string::npos)
      << log;
  EXPECT_TRUE(EndsWithin(frozen, milliseconds(10'000))) << "the hung keeper was killed";

  ExpectTheNextRestartReadopts(cluster, cold);
}

// A keeper that runs but never answers (deadlocked) across a controller restart: here a
// process named baton-keeper that listens at the keeper's socket and never accepts, put there
// once the keeper was killed. The new controller asks it again for its grace, then kills it and
// starts another; this restart is cold, but the new keeper keeps the new memory at once, so the
// next restart re-adopts the same engines.
TEST(KeeperDeath, AKeeperThatRunsButNeverAnswersIsReplacedAndTheNextRestartIsWarm) {
  ChaosCluster cluster;
  const pid_t keeper = cluster.KeeperPid();
  ASSERT_GT(keeper, 0);
  cluster.KillController();
  // Through a pidfd, awaited until it has exited: its socket is then stale, and replaced.
  UniqueFd pidfd(PidfdOpen(keeper));
  ASSERT_TRUE(pidfd.valid());
  ASSERT_EQ(PidfdSendSignal(pidfd.get(), SIGKILL), 0);
  pollfd exited{.fd = pidfd.get(), .events = POLLIN, .revents = 0};
  ASSERT_EQ(::poll(&exited, 1, 10'000), 1);
  const std::string socket = cluster.dir() + "/run/keeper.sock";
  ASSERT_EQ(::unlink(socket.c_str()), 0);
  const pid_t silent = testing_support::StartSilentListener(socket, "baton-keeper");
  ASSERT_GT(silent, 0);
  cluster.RestartController();
  const json cold =
      cluster.WaitFor([&](const json& s) { return IsReady(s) && KeptAgain(s, silent, 0); },
                      "a pair, and a new keeper keeping its memory");
  const int status = testing_support::ReapWithin(silent, milliseconds(10'000));
  EXPECT_TRUE(status != -1 && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
      << "the silent keeper was killed: " << status;
  const std::string log = cluster.Log();
  EXPECT_NE(log.find("baton-keeper (pid " + std::to_string(silent) + ") at " + cluster.dir() +
                     "/run/keeper.sock accepted but did not answer within 5000 ms while it runs "
                     "(busy or deadlocked): hung; killed, and a new one is started"),
            std::string::npos)
      << log;

  ExpectTheNextRestartReadopts(cluster, cold);
}

// A controller started with controller.keep_memory = false after one that kept its memory:
// the keeper left holding that memory for nobody is let go, and said so.
TEST(KeeperDeath, AKeeperLeftByAPreviousControllerIsLetGoWithoutKeepMemory) {
  ChaosCluster cluster;
  const pid_t keeper = cluster.KeeperPid();
  ASSERT_GT(keeper, 0);
  cluster.KillController();
  const std::string path = cluster.dir() + "/controller.toml";
  std::string config = ReadFile(path);
  const size_t at = config.find("[controller]\n");
  ASSERT_NE(at, std::string::npos) << config;
  config.insert(at + 13, "keep_memory = false\n");
  std::ofstream(path) << config;
  cluster.RestartController();
  EXPECT_TRUE(EndsWithin(keeper, milliseconds(10'000))) << cluster.Log();
  EXPECT_NE(cluster.Log().find("baton-keeper (pid " + std::to_string(keeper) +
                               ") of a previous controller kept its memory, and "
                               "controller.keep_memory is false: let go"),
            std::string::npos)
      << cluster.Log();
  EXPECT_EQ(Keeper(cluster.Status())["state"], "off");
}

// A clean stop whose keeper cannot be asked to let go (its socket removed, as a cleaner of
// the runtime directory would): the keeper is killed through the controller's pidfd rather
// than left holding the weights and the pool for nobody.
TEST(KeeperDeath, ACleanStopKillsAKeeperThatCannotBeAskedToLetGo) {
  ChaosCluster cluster;
  const pid_t keeper = cluster.KeeperPid();
  ASSERT_GT(keeper, 0);
  ASSERT_EQ(::unlink((cluster.dir() + "/run/keeper.sock").c_str()), 0);
  EXPECT_EQ(cluster.StopController(), 0);
  EXPECT_TRUE(EndsWithin(keeper, milliseconds(10'000))) << cluster.Log();
  EXPECT_NE(cluster.Log().find("baton-keeper (pid " + std::to_string(keeper) +
                               ") did not let the memory go when asked: SIGKILL sent"),
            std::string::npos)
      << cluster.Log();
}

}  // namespace
}  // namespace baton::chaos
