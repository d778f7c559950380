// Graceful shutdown of the real daemon: SIGTERM sends every engine Stop, the engines exit by
// themselves and are reaped, the controller exits 0, and no epoch is spent on it. An engine
// that ignores Stop is killed once stop_grace_ms has passed.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "controller/epoch_journal.h"
#include "tests/chaos/chaos_harness.h"

namespace baton::chaos {
namespace {

// The reservation on disk (a reopened journal starts after it).
uint64_t JournalEpoch(const ChaosCluster& cluster) {
  Result<EpochJournal> journal = EpochJournal::Open(cluster.dir() + "/run/state/epoch.journal");
  EXPECT_TRUE(journal.ok()) << journal.status().ToString();
  return journal.ok() ? journal->reserved() : 0;
}

// The controller's log from the shutdown on.
std::string ShutdownLog(const ChaosCluster& cluster) {
  const std::string log = cluster.Log();
  const size_t at = log.find("shutting down");
  return at == std::string::npos ? "" : log.substr(at);
}

std::string EngineLine(const json& engine, const std::string& what) {
  return "engine " + std::to_string(engine["id"].get<uint64_t>()) + " (pid " +
         std::to_string(PidOf(engine)) + ") " + what;
}

void ExpectExitedZero(int wstatus) {
  EXPECT_TRUE(WIFEXITED(wstatus)) << "controller wait status " << wstatus;
  EXPECT_EQ(WEXITSTATUS(wstatus), 0);
}

TEST(ChaosShutdown, SigtermStopsEnginesCleanlyAndSpendsNoEpoch) {
  ChaosCluster cluster;
  const json status = cluster.Status();
  const uint64_t epoch = status["epoch"]["durable"].get<uint64_t>();
  ASSERT_GT(epoch, 0u);
  ASSERT_EQ(status["engines"].size(), 2u);

  ExpectExitedZero(cluster.StopController());
  const std::string log = ShutdownLog(cluster);
  ASSERT_FALSE(log.empty()) << cluster.Log();
  for (const json& e : status["engines"]) {
    EXPECT_NE(log.find(EngineLine(e, "exited after Stop: exited with status 0")), std::string::npos)
        << e["role"] << " engine did not exit by itself:\n"
        << log;
  }
  EXPECT_EQ(log.find("fenced"), std::string::npos) << log;
  EXPECT_EQ(log.find("SIGKILL"), std::string::npos) << log;
  EXPECT_NE(log.find("engines stopped at epoch " + std::to_string(epoch)), std::string::npos)
      << log;
  EXPECT_EQ(JournalEpoch(cluster), status["epoch"]["reserved"].get<uint64_t>());
}

TEST(ChaosShutdown, EngineIgnoringStopIsKilledAfterTheGrace) {
  ChaosCluster cluster;
  const json status = cluster.Status();
  const json standby = EngineWithRole(status, "standby");
  const json primary = EngineWithRole(status, "primary");
  ASSERT_FALSE(standby.is_null());
  ASSERT_EQ(::kill(PidOf(standby), SIGSTOP), 0);  // it cannot answer Stop now

  ExpectExitedZero(cluster.StopController());
  const std::string log = ShutdownLog(cluster);
  EXPECT_NE(log.find(EngineLine(standby,
                                "still running 2000 ms after Stop: SIGKILL sent; "
                                "killed by SIGKILL")),
            std::string::npos)
      << log;
  EXPECT_NE(log.find(EngineLine(primary, "exited after Stop: exited with status 0")),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("fenced"), std::string::npos) << log;
  EXPECT_EQ(JournalEpoch(cluster), status["epoch"]["reserved"].get<uint64_t>());
}

// A second signal during the stop (a script's cleanup sends SIGTERM after its Ctrl-C reached
// the controller too) does not cut the stop short: the controller exits 0 once it has removed
// its engine cgroups and their base, however the signals fall.
TEST(ChaosShutdown, SignalsDuringTheStopDoNotCutItShort) {
  ChaosCluster cluster;
  const json status = cluster.Status();
  const json base = status["fencing"]["cgroup_base"];
  const pid_t pid = cluster.controller_pid();
  ASSERT_EQ(::kill(pid, SIGINT), 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  siginfo_t exited{};
  // Until it exits (seen without reaping it: WaitControllerExit reaps), SIGTERM every 200 µs.
  while (::waitid(P_PID, pid, &exited, WEXITED | WNOHANG | WNOWAIT) == 0 && exited.si_pid == 0 &&
         std::chrono::steady_clock::now() < deadline) {
    ::kill(pid, SIGTERM);
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  ExpectExitedZero(cluster.WaitControllerExit());
  EXPECT_NE(ShutdownLog(cluster).find("INFO controller: stopped"), std::string::npos)
      << cluster.Log();
  if (base.is_string()) {
    EXPECT_NE(::access(base.get<std::string>().c_str(), F_OK), 0)
        << base.get<std::string>() << " left behind";
  }
  for (const json& e : status["engines"]) {
    EXPECT_FALSE(ProcessExists(PidOf(e))) << "engine " << e.dump() << " outlived the controller";
  }
}

}  // namespace
}  // namespace baton::chaos
