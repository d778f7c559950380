// Crash-looping engines: past max_failures in the window the pair goes to a *_backoff state
// that `batonctl status` shows, restarts are held back, and the controller never busy-loops.
// A crashed engine's log is quoted and kept apart from the ones pruned.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "tests/chaos/chaos_harness.h"
#include "tests/chaos/switchover_support.h"

namespace baton::chaos {
namespace {

TEST(ChaosCrashLoop, CrashingStandbysDegradeThePairWithBackoff) {
  // Engines 1 and 2 behave; every later engine exits at once.
  ClusterOptions options;
  options.engine_args = {"--crash-if-id-above", "2"};
  options.max_failures = 3;
  options.initial_backoff_ms = 3000;
  ChaosCluster cluster(options);
  const json before = cluster.Status();
  const json primary = EngineWithRole(before, "primary");
  ASSERT_EQ(::kill(PidOf(EngineWithRole(before, "standby")), SIGKILL), 0);

  const json tripped =
      cluster.WaitFor([](const json& s) { return s["pair"]["state"] == "degraded_backoff"; },
                      "the crash-loop guard to trip");
  EXPECT_TRUE(tripped["crash_loop"]["in_backoff"].get<bool>()) << tripped.dump(2);
  EXPECT_GE(tripped["crash_loop"]["level"].get<int>(), 1);
  EXPECT_GE(tripped["crash_loop"]["total_failures"].get<int>(), 3);
  EXPECT_EQ(EngineWithRole(tripped, "primary")["pid"], primary["pid"]) << "the primary serves on";
  const uint64_t launches = tripped["controller"]["launches"].get<uint64_t>();

  // While backing off, nothing is launched.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const json later = cluster.Status();
  if (later["crash_loop"]["in_backoff"].get<bool>()) {
    EXPECT_EQ(later["controller"]["launches"].get<uint64_t>(), launches);
  }
  // A few backoff rounds later the launch count is still small: no busy loop.
  EXPECT_LE(later["controller"]["launches"].get<uint64_t>(), 2u + 3u + 2u);
  EXPECT_TRUE(cluster.ControllerAlive());
  EXPECT_EQ(later["invariants"], "ok");
}

TEST(ChaosCrashLoop, EngineThatExitsAtOnceLeavesThePairDownWithBackoff) {
  ClusterOptions options;
  options.engine_command = {"/bin/false"};
  options.max_failures = 3;
  options.initial_backoff_ms = 5000;
  options.wait_ready = false;
  ChaosCluster cluster(options);
  const json tripped =
      cluster.WaitFor([](const json& s) { return s["pair"]["state"] == "down_backoff"; },
                      "the crash-loop guard to trip");
  EXPECT_TRUE(tripped["crash_loop"]["in_backoff"].get<bool>());
  EXPECT_GT(tripped["crash_loop"]["next_restart_in_ms"].get<double>(), 0.0);
  const uint64_t launches = tripped["controller"]["launches"].get<uint64_t>();
  EXPECT_LE(launches, 4u);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const json later = cluster.Status();
  EXPECT_EQ(later["controller"]["launches"].get<uint64_t>(), launches) << "no busy loop";
  EXPECT_TRUE(later["history"]["exits"].size() >= 3) << later.dump(2);
  EXPECT_TRUE(cluster.ControllerAlive());
}

// An engine that exits with an error says why in its own log: the controller's exit line and
// status quote the log's last line, so an operator sees the reason without opening it.
TEST(ChaosCrashLoop, AnEngineExitQuotesTheLastLineOfItsLog) {
  ClusterOptions options;
  options.engine_command = {"/bin/sh", "-c",
                            "echo 'starting'; echo 'model config: num_hidden_layers = -3 is "
                            "outside [1, 4096]' >&2; exit 1"};
  options.engine_logs = true;
  options.max_failures = 3;
  options.initial_backoff_ms = 5000;
  options.wait_ready = false;
  ChaosCluster cluster(options);
  const json tripped =
      cluster.WaitFor([](const json& s) { return !s["history"]["exits"].empty(); }, "an exit");
  const json& first = tripped["history"]["exits"][0];
  const std::string kept = cluster.dir() + "/engine-logs/engine-" +
                           std::to_string(first["id"].get<uint64_t>()) + ".crash.log";
  EXPECT_EQ(first["exit"].get<std::string>(),
            "exited with status 1 (its log ends: \"model config: num_hidden_layers = -3 is "
            "outside [1, 4096]\"; log kept as " +
                kept + ")")
      << tripped.dump(2);
  EXPECT_TRUE(cluster.ControllerAlive());
}

// The log of an engine that crashed (here killed by someone else than the controller, as the
// OOM killer would) is kept apart as engine-<id>.crash.log: the switch-overs after it, each a
// new engine, prune the other logs down to engine.log_keep but not that one.
TEST(ChaosCrashLoop, ACrashedEnginesLogOutlastsTheLaunchesAfterIt) {
  ClusterOptions options;
  options.engine_logs = true;
  options.engine_log_keep = 1;
  ChaosCluster cluster(options);
  const json before = cluster.Status();
  const uint64_t crashed = PrimaryId(before);
  ASSERT_EQ(::kill(PidOf(EngineWithRole(before, "primary")), SIGKILL), 0);
  json status = WaitNewPrimary(cluster, crashed, "the standby promoted");
  const std::string logs = cluster.dir() + "/engine-logs/";
  const std::string kept = logs + "engine-" + std::to_string(crashed) + ".crash.log";
  EXPECT_TRUE(std::filesystem::exists(kept));
  EXPECT_FALSE(std::filesystem::exists(logs + "engine-" + std::to_string(crashed) + ".log"));
  bool named = false;
  for (const json& e : status["history"]["exits"]) {
    named = named || e["exit"].get<std::string>() == "killed by SIGKILL (log kept as " + kept + ")";
  }
  EXPECT_TRUE(named) << status["history"].dump(2);
  std::vector<uint64_t> retired;
  for (int i = 0; i < 3; ++i) {
    retired.push_back(PrimaryId(status));
    status = SwitchOver(cluster);
  }
  EXPECT_TRUE(std::filesystem::exists(kept)) << "pruned with the switch-overs' logs";
  // The last one retired may still have been exiting at the last launch's pruning.
  for (size_t i = 0; i + 1 < retired.size(); ++i) {
    const std::string name = logs + "engine-" + std::to_string(retired[i]);
    EXPECT_FALSE(std::filesystem::exists(name + ".log")) << "a retired engine's log is kept";
  }
  for (uint64_t id : retired) {
    const std::string name = logs + "engine-" + std::to_string(id) + ".crash.log";
    EXPECT_FALSE(std::filesystem::exists(name)) << "a switch-over is no crash";
  }
}

}  // namespace
}  // namespace baton::chaos
