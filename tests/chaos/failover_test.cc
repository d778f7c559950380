// Chaos drills with real processes: a real baton-controller, real engine processes (the SDK
// test engine), real signals. Each drill breaks the pair, waits (by polling batonctl status)
// for it to return to primary + standby, and checks the fencing invariants.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "tests/chaos/chaos_harness.h"

namespace baton::chaos {
namespace {

TEST(ChaosFailover, KillPrimary) {
  ChaosCluster cluster;
  const json before = cluster.Status();
  const json primary = EngineWithRole(before, "primary");
  const json standby = EngineWithRole(before, "standby");
  ASSERT_FALSE(primary.is_null());
  cluster.CheckFencing();

  ASSERT_EQ(::kill(PidOf(primary), SIGKILL), 0);
  WaitNewPrimary(cluster, primary["id"], "the standby to take over");
  const json after = cluster.WaitFor(Settled, "the old primary's blocks to move on");
  EXPECT_EQ(PrimaryId(after), standby["id"].get<uint64_t>()) << "the standby was promoted";
  EXPECT_GT(Epoch(after), Epoch(before));
  EXPECT_EQ(EngineWithRole(after, "primary")["epoch"], after["epoch"]["durable"]);
  EXPECT_FALSE(ProcessExists(PidOf(primary))) << "the old primary must be reaped";
  EXPECT_EQ(after["pool"]["granted"], BlocksBesideTheReserve(after)) << "its blocks moved on";
  EXPECT_EQ(after["pool"]["quarantined"], 0);
  const CtlResult timeline = cluster.Ctl({"timeline"});
  ASSERT_EQ(timeline.exit_code, 0);
  const json t = timeline.out["timeline"];
  EXPECT_EQ(t["kind"], "failover");
  EXPECT_TRUE(t["stamps"].contains("reaped_ms"));
  EXPECT_TRUE(t["stamps"].contains("promote_acked_ms"));
  // The standby started on the promotion reserve at once; the old primary's blocks moved to
  // it only once it was reaped and past the barrier.
  EXPECT_TRUE(t["promotion"]["before_barrier"].get<bool>()) << t.dump(2);
  EXPECT_LE(t["stamps"]["reaped_ms"].get<double>(), t["stamps"]["barrier_passed_ms"].get<double>());
  EXPECT_GT(t["promotion"]["quarantined_blocks"].get<int>(), 0);
  EXPECT_TRUE(t["phases"].contains("teardown_ms"));
  cluster.CheckFencing();
}

TEST(ChaosFailover, KillPrimaryWithHugePageBlocks) {
  // 2 MiB blocks: the pool is a hugetlb memfd where huge pages are reserved (normal pages,
  // with a warning, elsewhere); extents are mapped at 2 MiB-aligned offsets.
  ClusterOptions options;
  options.blocks = 4;
  options.block_bytes = 2 << 20;
  ChaosCluster cluster(options);
  const json before = cluster.Status();
  const json primary = EngineWithRole(before, "primary");
  ASSERT_EQ(::kill(PidOf(primary), SIGKILL), 0);
  WaitNewPrimary(cluster, primary["id"], "the standby to take over");
  const json after = cluster.WaitFor(Settled, "the old primary's blocks to move on");
  EXPECT_EQ(after["pool"]["granted"], BlocksBesideTheReserve(after));
  EXPECT_GT(Epoch(after), Epoch(before));
  cluster.CheckFencing();
}

TEST(ChaosFailover, KillStandby) {
  ChaosCluster cluster(TolerantHealth());  // the primary must not be taken for hung meanwhile
  const json before = cluster.Status();
  const json primary = EngineWithRole(before, "primary");
  const json standby = EngineWithRole(before, "standby");
  ASSERT_EQ(::kill(PidOf(standby), SIGKILL), 0);
  const json after = cluster.WaitFor(
      [&](const json& s) {
        const json sb = EngineWithRole(s, "standby");
        return IsReady(s) && !sb.is_null() && sb["id"] != standby["id"];
      },
      "a replacement standby");
  const json primary_after = EngineWithRole(after, "primary");
  EXPECT_EQ(primary_after["pid"], primary["pid"]) << "the primary is unaffected";
  EXPECT_EQ(primary_after["epoch"], primary["epoch"]);
  EXPECT_EQ(Epoch(after), Epoch(before)) << "losing a standby moves no block";
  EXPECT_FALSE(ProcessExists(PidOf(standby)));
  cluster.CheckFencing();
}

TEST(ChaosFailover, KillBoth) {
  ChaosCluster cluster;
  const json before = cluster.Status();
  const json primary = EngineWithRole(before, "primary");
  const json standby = EngineWithRole(before, "standby");
  ASSERT_EQ(::kill(PidOf(primary), SIGKILL), 0);
  ASSERT_EQ(::kill(PidOf(standby), SIGKILL), 0);
  const json after = cluster.WaitFor(
      [&](const json& s) {
        return IsReady(s) && PrimaryId(s) != primary["id"] && PrimaryId(s) != standby["id"];
      },
      "a new pair after losing both engines");
  EXPECT_GT(Epoch(after), Epoch(before));
  EXPECT_FALSE(ProcessExists(PidOf(primary)));
  EXPECT_FALSE(ProcessExists(PidOf(standby)));
  cluster.CheckFencing();
}

// A promoted engine that fails before acknowledging holds the blocks granted to it: the
// standby that registered meanwhile is promoted once it is reaped, and gets them all.
TEST(ChaosFailover, BlocksOfAPromotionThatNeverAckedMoveOn) {
  ClusterOptions options;
  options.promote_timeout_ms = 1500;
  options.first_engine_rogue = "mute";  // registers, then never answers its Promote
  ChaosCluster cluster(options);
  // Either engine may register first. When the other one did, the mute engine waits as the
  // standby: losing the primary gets it promoted.
  const json first = cluster.Status();
  if (EngineWithRole(first, "standby")["version"] == "rogue") {
    ASSERT_EQ(::kill(PidOf(EngineWithRole(first, "primary")), SIGKILL), 0);
  }
  const json after = cluster.WaitFor(
      [&](const json& s) {
        const json p = EngineWithRole(s, "primary");
        bool mute_gone = false;
        for (const json& e : s["history"]["exits"]) {
          mute_gone |= e["cause"].get<std::string>().find("promotion") != std::string::npos;
        }
        return IsReady(s) && !p.is_null() && p["version"] != "rogue" && mute_gone;
      },
      "a primary after the mute engine's promotion timed out");
  const json settled = cluster.WaitFor(Settled, "the mute engine's blocks to move on");
  const json primary = EngineWithRole(settled, "primary");
  EXPECT_EQ(primary["blocks"], BlocksBesideTheReserve(settled)) << settled.dump(2);
  EXPECT_EQ(settled["pool"]["quarantined"], 0);
  bool mute_fenced = false;
  for (const json& e : after["history"]["exits"]) {
    mute_fenced |= e["cause"].get<std::string>().find("promotion") != std::string::npos;
  }
  EXPECT_TRUE(mute_fenced) << after["history"].dump(2);
  cluster.CheckFencing();
}

TEST(ChaosFailover, StoppedPrimaryIsKilledAndReapedBeforeItsBlocksMove) {
  ChaosCluster cluster;
  const json before = cluster.Status();
  const json primary = EngineWithRole(before, "primary");
  ASSERT_EQ(::kill(PidOf(primary), SIGSTOP), 0);
  const json after = WaitNewPrimary(cluster, primary["id"], "the hang to be detected");
  // By the time the standby serves, the stopped primary is dead and reaped: SIGCONT finds
  // no process.
  errno = 0;
  EXPECT_EQ(::kill(PidOf(primary), SIGCONT), -1);
  EXPECT_EQ(errno, ESRCH);
  const json t = cluster.Ctl({"timeline"}).out["timeline"];
  EXPECT_NE(t["cause"].get<std::string>().find("hung"), std::string::npos) << t.dump(2);
  EXPECT_TRUE(t["stamps"].contains("killed_ms"));
  EXPECT_TRUE(t["stamps"].contains("last_heartbeat_ms"));
  EXPECT_GT(Epoch(after), Epoch(before));
  cluster.CheckFencing();
}

TEST(ChaosFailover, DrillHangThroughBatonctl) {
  ChaosCluster cluster;
  const json primary = EngineWithRole(cluster.Status(), "primary");
  const CtlResult drill = cluster.Ctl({"drill", "hang"});
  ASSERT_EQ(drill.exit_code, 0) << drill.stdout_text;
  WaitNewPrimary(cluster, primary["id"], "drill hang to fail over");
  EXPECT_FALSE(ProcessExists(PidOf(primary)));
  const bool cgroup = primary["cgroup"].is_string() && !primary["cgroup"].empty();
  EXPECT_NE(cluster.Log().find(cgroup ? "by freezing its cgroup" : "by stopping its process group"),
            std::string::npos)
      << cluster.Log();
  cluster.CheckFencing();
}

// The processes of `pgid`'s group, from /proc (zombies left out: they hold no memory).
std::vector<pid_t> LiveGroupMembers(pid_t pgid) {
  std::vector<pid_t> out;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string line;
    std::getline(stat, line);
    const size_t paren = line.rfind(')');
    if (paren == std::string::npos) continue;
    std::istringstream rest(line.substr(paren + 2));
    char state = 0;
    long ppid = 0, group = 0;
    rest >> state >> ppid >> group;
    if (group == pgid && state != 'Z') out.push_back(static_cast<pid_t>(std::stol(name)));
  }
  return out;
}

// An engine started by a wrapper script (as `sh -c 'source venv/bin/activate; python ...'`
// does) is a grandchild of the controller. A fence kills its whole process group and the
// blocks move only once the group is empty; a hang drill stops all of it (its cgroup frozen,
// or the group stopped).
TEST(ChaosFailover, AWrappedEngineIsFencedWithItsWholeProcessGroup) {
  ClusterOptions options;
  options.engine_wrapper = {"/bin/sh", "-c", "\"$@\"; exit $?", "engine-wrapper"};
  ChaosCluster cluster(options);
  const json primary = EngineWithRole(cluster.Status(), "primary");
  const pid_t wrapper = PidOf(primary);
  const std::vector<pid_t> group = LiveGroupMembers(wrapper);
  ASSERT_EQ(group.size(), 2u) << "the shell and the engine it started";

  // The wrapper dies; the engine it started would live on with the pool mapped.
  ASSERT_EQ(::kill(wrapper, SIGKILL), 0);
  const json after = WaitNewPrimary(cluster, primary["id"], "the standby to take over");
  EXPECT_TRUE(LiveGroupMembers(wrapper).empty()) << "the wrapped engine outlived its fence";
  cluster.CheckFencing();

  // A hang drill stops the engine itself, not only its wrapper: the pair fails over.
  const json second = EngineWithRole(after, "primary");
  const std::vector<pid_t> second_group = LiveGroupMembers(PidOf(second));
  ASSERT_EQ(second_group.size(), 2u);
  ASSERT_EQ(cluster.Ctl({"drill", "hang"}).exit_code, 0);
  WaitNewPrimary(cluster, second["id"], "drill hang on a wrapped engine to fail over");
  EXPECT_TRUE(LiveGroupMembers(PidOf(second)).empty())
      << "a process of the group outlived its fence";
  cluster.CheckFencing();
}

// Engines whose wrapper first starts a worker in a new session (setsid, as a daemonizing
// helper does): out of reach of a process-group kill, and without PR_SET_PDEATHSIG. Each
// worker writes its pid to escaped-<engine pid> (the wrapper's pid: it execs the engine).
class EscapingWorkers {
 public:
  EscapingWorkers() {
    char tmpl[] = "/tmp/baton-escape-XXXXXX";
    EXPECT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  ~EscapingWorkers() { std::filesystem::remove_all(dir_); }

  ClusterOptions Options() const {
    ClusterOptions options;
    options.engine_wrapper = {
        "/bin/sh", "-c",
        "setsid sh -c 'echo $$ > \"$0\"; exec sleep 600' \"" + dir_ + "/escaped-$$\" & exec \"$@\"",
        "engine-wrapper"};
    return options;
  }

  // The worker of the engine with pid `engine` (0 if it never wrote its pid).
  pid_t WorkerOf(pid_t engine) const {
    const std::string file = dir_ + "/escaped-" + std::to_string(engine);
    pid_t worker = 0;
    for (int i = 0; i < 500 && worker == 0; ++i) {
      std::ifstream(file) >> worker;
      if (worker == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return worker;
  }

 private:
  std::string dir_;
};

// The engine's cgroup holds the escaped worker, and the fence kills it with the engine.
// Skipped where the controller runs without engine cgroups.
TEST(ChaosFailover, AWorkerThatLeftItsGroupIsFencedThroughTheCgroup) {
  EscapingWorkers workers;
  ChaosCluster cluster(workers.Options());
  const json before = cluster.Status();
  if (before["fencing"]["by"] != "cgroup") {
    GTEST_SKIP() << "no engine cgroups: " << before["fencing"].dump();
  }
  const json primary = EngineWithRole(before, "primary");
  EXPECT_FALSE(primary["cgroup"].is_null()) << primary.dump();
  EXPECT_GT(primary["cpu_s"].get<double>(), 0.0) << "it mapped the weights and registered";
  const pid_t escaped = workers.WorkerOf(PidOf(primary));
  ASSERT_GT(escaped, 0) << "the worker never wrote its pid";
  ASSERT_FALSE(LiveGroupMembers(escaped).empty());
  EXPECT_NE(::getpgid(escaped), PidOf(primary)) << "the worker is outside the engine's group";

  ASSERT_EQ(::kill(PidOf(primary), SIGKILL), 0);
  WaitNewPrimary(cluster, primary["id"], "the standby to take over");
  EXPECT_TRUE(LiveGroupMembers(escaped).empty()) << "the escaped worker outlived its fence";
  // The dead engine's cgroup is removed, at once or by a later sweep.
  const std::string path = primary["cgroup"].get<std::string>();
  cluster.WaitFor(
      [&](const json& st) {
        return st["fencing"]["cgroups_awaiting_removal"] == 0 && ::access(path.c_str(), F_OK) != 0;
      },
      "the dead engine's cgroup removed");
  cluster.CheckFencing();
}

// Engines that died while no controller ran leave their escaped workers; the next controller
// of the same runtime directory finds them in the dead engines' cgroups and kills them before
// it starts a pair. The workers of engines it re-adopts stay (they are part of them).
TEST(ChaosFailover, ARestartedControllerKillsWhatTheEarlierOnesEnginesLeft) {
  EscapingWorkers workers;
  ChaosCluster cluster(workers.Options());
  const json before = cluster.Status();
  if (before["fencing"]["by"] != "cgroup") {
    GTEST_SKIP() << "no engine cgroups: " << before["fencing"].dump();
  }
  std::vector<pid_t> escaped;
  for (const json& e : before["engines"]) {
    escaped.push_back(workers.WorkerOf(PidOf(e)));
    ASSERT_GT(escaped.back(), 0) << "engine " << e["id"] << "'s worker never wrote its pid";
  }
  cluster.KillController();
  cluster.RestartController();
  for (pid_t w : escaped) {
    EXPECT_FALSE(LiveGroupMembers(w).empty()) << "worker " << w << " of a re-adopted engine";
  }
  cluster.KillController();
  for (const json& e : before["engines"]) ::kill(PidOf(e), SIGKILL);
  for (pid_t w : escaped) {
    EXPECT_FALSE(LiveGroupMembers(w).empty()) << "worker " << w << " outlives its engine";
  }
  cluster.RestartController();
  const json after = cluster.Status();
  EXPECT_GE(after["fencing"]["leftovers_killed"].get<size_t>(), escaped.size()) << after.dump();
  for (pid_t w : escaped) {
    EXPECT_TRUE(LiveGroupMembers(w).empty()) << "worker " << w << " outlived the restart";
  }
  cluster.CheckFencing();
}

TEST(ChaosFailover, ErrorReportFencesAtOnce) {
  ChaosCluster cluster;
  const json before = cluster.Status();
  const json primary = EngineWithRole(before, "primary");
  const CtlResult drill = cluster.Ctl({"drill", "error"});
  ASSERT_EQ(drill.exit_code, 0) << drill.stdout_text;
  const json after = WaitNewPrimary(cluster, primary["id"], "the error report to fail over");
  EXPECT_FALSE(ProcessExists(PidOf(primary)));
  const json t = cluster.Ctl({"timeline"}).out["timeline"];
  EXPECT_NE(t["cause"].get<std::string>().find("error"), std::string::npos) << t.dump(2);
  EXPECT_GT(Epoch(after), Epoch(before));
  cluster.CheckFencing();
}

TEST(ChaosFailover, DrillKillRecordsEveryPhase) {
  ChaosCluster cluster;
  const json primary = EngineWithRole(cluster.Status(), "primary");
  ASSERT_EQ(cluster.Ctl({"drill", "kill"}).exit_code, 0);
  WaitNewPrimary(cluster, primary["id"], "drill kill to fail over");
  const json t = cluster.WaitFor(
      [](const json& s) { return s["last_promotion"]["stamps"].contains("standby_ready_ms"); },
      "the replacement standby in the timeline")["last_promotion"];
  for (const char* stamp :
       {"injected_ms", "detected_ms", "epoch_durable_ms", "reaped_ms", "promote_sent_ms",
        "promote_acked_ms", "route_published_ms", "standby_launched_ms", "standby_ready_ms"}) {
    EXPECT_TRUE(t["stamps"].contains(stamp)) << stamp << " missing in " << t.dump(2);
  }
  for (const char* phase : {"detect_ms", "fence_ms", "promote_ms", "ready_ms", "total_ms"}) {
    EXPECT_TRUE(t["phases"].contains(phase)) << phase << " missing in " << t.dump(2);
  }
  cluster.CheckFencing();
}

// The replacement standby is launched policy.standby_relaunch_delay_ms after the new primary
// acknowledged its promotion (by the controller's clock, whose stamps the timeline shows),
// so that its start does not compete with the new primary's first requests.
TEST(ChaosFailover, ReplacementStandbyWaitsForTheRelaunchDelay) {
  for (const int delay_ms : {0, 400}) {
    ClusterOptions options;
    options.standby_relaunch_delay_ms = delay_ms;
    ChaosCluster cluster(options);
    const json primary = EngineWithRole(cluster.Status(), "primary");
    ASSERT_EQ(cluster.Ctl({"drill", "kill"}).exit_code, 0);
    WaitNewPrimary(cluster, primary["id"], "drill kill to fail over");
    const json stamps = cluster.WaitFor(
        [](const json& s) { return s["last_promotion"]["stamps"].contains("standby_ready_ms"); },
        "the replacement standby in the timeline")["last_promotion"]["stamps"];
    const double waited =
        stamps["standby_launched_ms"].get<double>() - stamps["promote_acked_ms"].get<double>();
    EXPECT_GE(waited, delay_ms) << stamps.dump(2);
    if (delay_ms > 0) {
      EXPECT_NE(cluster.Log().find("the replacement standby starts in"), std::string::npos);
    }
    cluster.CheckFencing();
  }
}

TEST(ChaosFailover, SlowEngineUnderLoadIsNotKilled) {
  // The test engine's compute thread spins 1.5 s at a time, longer than the 1 s (10 missed
  // heartbeats) a silent engine may go unnoticed here; its heartbeats come from the SDK's own
  // thread. The 1 s leaves headroom for a loaded 2-core machine.
  ClusterOptions options = TolerantHealth();
  options.engine_args = {"--busy-ms", "1500"};
  ChaosCluster cluster(options);
  const json before = cluster.Status();
  const json primary = EngineWithRole(before, "primary");
  // Let a few busy rounds pass; then nothing may have failed.
  cluster.WaitFor(
      [&](const json& s) {
        const json p = EngineWithRole(s, "primary");
        return !p.is_null() && p["heartbeats"].get<uint64_t>() >= 30;
      },
      "30 heartbeats from the busy primary");
  const json after = cluster.Status();
  EXPECT_EQ(PrimaryId(after), primary["id"].get<uint64_t>());
  EXPECT_EQ(after["controller"]["failovers"], 0);
  EXPECT_EQ(after["crash_loop"]["total_failures"], 0);
}

}  // namespace
}  // namespace baton::chaos
