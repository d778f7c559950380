// A controller killed in the middle of a failover, with real processes: the primary's main
// process was killed, the standby promoted at once on the promotion reserve, and the old
// primary's blocks are still quarantined because a worker of that primary (engine_worker.h)
// maps them and has not exited. That worker is stuck in the kernel (a cgroup v1 freezer
// holds it, as a driver call that never returns would): the fence's SIGKILL is pending and
// it stays in the dead engine's process group and cgroup, so the barrier does not pass for
// as long as the test keeps it frozen. The next controller re-adopts the promoted engine,
// holds the old primary's blocks back while the worker lives, and hands them on (freed, then
// granted to the primary beside the refilled reserve: docs/architecture.md, "What survives
// the controller") only once it is gone; no foreign word ever shows in the new primary's
// blocks. Every check goes through batonctl and the test engines' violation files. A host
// without a cgroup v1 freezer (cgroup v2 alone, whose freezer lets SIGKILL through) skips them.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include "base/process/proc_table.h"
#include "tests/chaos/chaos_harness.h"
#include "tests/chaos/controller_restart_support.h"
#include "tests/chaos/engine_worker.h"

namespace baton::chaos {
namespace {

constexpr int kBlocks = 16;
constexpr int kReserve = 4;
constexpr int kOldPrimaryBlocks = kBlocks - kReserve;
constexpr const char* kFreezerRoot = "/sys/fs/cgroup/freezer";

// One process held in a cgroup v1 freezer of its own: frozen, it cannot act on a SIGKILL
// (it stays, in D state, in its process group and cgroup v2) until it is thawed. Thawed and
// the directory removed on destruction. Used from the test's thread.
class FrozenProcess {
 public:
  // Why `pid` could not be frozen ("" once it is). Only a host without a cgroup v1 freezer
  // that this user may use sets `unavailable` (the test is then skipped); any other failure
  // is the test's.
  std::string Freeze(pid_t pid, bool* unavailable) {
    *unavailable = false;
    dir_ = std::string(kFreezerRoot) + "/baton-chaos-" + std::to_string(::getpid()) + "-" +
           std::to_string(pid);
    if (::mkdir(dir_.c_str(), 0755) != 0 && errno != EEXIST) {
      const int err = errno;
      *unavailable = err == ENOENT || err == EACCES || err == EPERM || err == EROFS;
      const std::string why = "no cgroup v1 freezer (" + dir_ + ": " + std::strerror(err) + ")";
      dir_.clear();
      return why;
    }
    if (!Write("cgroup.procs", std::to_string(pid)) || !Write("freezer.state", "FROZEN")) {
      return "cannot freeze pid " + std::to_string(pid) + " in " + dir_;
    }
    for (int i = 0; i < 500 && State() != "FROZEN"; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return State() == "FROZEN" ? "" : "pid " + std::to_string(pid) + " did not freeze";
  }
  void Thaw() {
    if (!dir_.empty()) (void)Write("freezer.state", "THAWED");
  }
  // Thawed; a member the fence's SIGKILL never reached is killed, so that the directory can
  // go.
  ~FrozenProcess() {
    if (dir_.empty()) return;
    Thaw();
    std::ifstream members(dir_ + "/cgroup.procs");
    for (pid_t pid; members >> pid;) (void)::kill(pid, SIGKILL);
    for (int i = 0; i < 500 && ::rmdir(dir_.c_str()) != 0 && errno == EBUSY; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

 private:
  bool Write(const std::string& file, const std::string& value) const {
    std::ofstream out(dir_ + "/" + file);
    out << value << "\n";
    out.flush();
    return static_cast<bool>(out);
  }
  std::string State() const {
    std::string state;
    std::ifstream(dir_ + "/freezer.state") >> state;
    return state;
  }

  std::string dir_;
};

// Waits until `pid` is gone or a zombie: its SIGKILL acted.
bool WaitGone(pid_t pid) {
  for (int i = 0; i < 2000 && ProcessRunning(pid); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return !ProcessRunning(pid);
}

// `promote_hold_file`: the test engines' --promote-hold-file (none when empty).
ClusterOptions Options(const std::string& promote_hold_file = "") {
  ClusterOptions options;
  options.blocks = kBlocks;
  options.promotion_reserve_blocks = kReserve;
  options.promote_timeout_ms = 60'000;
  options.engine_args = {"--fill-blocks", "--worker-mb", "16"};
  if (!promote_hold_file.empty()) {
    options.engine_args.insert(options.engine_args.end(),
                               {"--promote-hold-file", promote_hold_file});
  }
  // The barrier waits for the frozen worker as long as the test needs, not 5 s.
  options.extra_toml = "[gpu]\nrelease_timeout_ms = 600000\n";
  return options;
}

// The failover the controller is killed in: the primary's worker frozen, its main process
// killed, the standby promoted on the reserve and serving while the old primary's blocks wait
// for the barrier. `status` is the status then (null after a failure); `skip` says why the
// worker could not be frozen ("" when it was).
struct MidFailover {
  uint64_t old_primary = 0;
  pid_t worker = 0;
  json status;
  std::string skip;
};

// `serving`: whether the promoted engine has said it serves (else it is still promoting).
MidFailover FailOverWithAFrozenWorker(ChaosCluster& cluster, FrozenProcess& frozen,
                                      bool serving = true) {
  MidFailover m;
  const json primary = EngineWithRole(cluster.Status(), "primary");
  if (primary.is_null()) {
    ADD_FAILURE() << "no primary";
    return m;
  }
  m.old_primary = primary["id"];
  m.worker = testing::WorkerPid(cluster.dir(), m.old_primary);
  if (m.worker <= 0) {
    ADD_FAILURE() << "the primary's worker never started";
    return m;
  }
  bool unavailable = false;
  const std::string not_frozen = frozen.Freeze(m.worker, &unavailable);
  if (unavailable) {
    m.skip = not_frozen;
    return m;
  }
  if (!not_frozen.empty()) {
    ADD_FAILURE() << not_frozen;
    return m;
  }
  cluster.CheckFencing();
  EXPECT_EQ(::kill(PidOf(primary), SIGKILL), 0);  // its main process only: the fence does the rest
  m.status = cluster.WaitFor(
      [&](const json& s) {
        const json p = EngineWithRole(s, serving ? "primary" : "promoting");
        return !p.is_null() && p["id"] != m.old_primary && p["serving"].get<bool>() == serving &&
               s["fencing"]["barrier_waits"] == 1 && s["pool"]["quarantined"] == kOldPrimaryBlocks;
      },
      "the standby serving on the reserve, the old primary's blocks behind its barrier");
  EXPECT_TRUE(ProcessExists(m.worker) && ProcessRunning(m.worker))
      << "the frozen worker is gone: the barrier could have passed";
  EXPECT_EQ(EngineWithRole(m.status, serving ? "primary" : "promoting")["blocks"], kReserve)
      << m.status.dump(2);
  return m;
}

// The new primary `heir` re-adopted by the restarted controller, serving the same process,
// while the old primary's blocks are held back: granted to no one, and the recovery waits.
void ExpectHeldBack(const json& s, const json& heir) {
  const json p = EngineWithRole(s, "primary");
  ASSERT_FALSE(p.is_null()) << s.dump(2);
  EXPECT_EQ(p["id"], heir["id"]);
  EXPECT_EQ(PidOf(p), PidOf(heir)) << "the same process, re-adopted";
  EXPECT_TRUE(p["adopted"].get<bool>());
  EXPECT_TRUE(p["serving"].get<bool>());
  EXPECT_EQ(p["blocks"], kReserve) << "the old primary's blocks joined it before its barrier";
  EXPECT_TRUE(s["controller"]["recovery"]["in_progress"].get<bool>()) << s["controller"].dump(2);
  EXPECT_EQ(s["pool"]["free"], 0) << s["pool"].dump(2);
  EXPECT_EQ(s["pool"]["granted"], kReserve) << s["pool"].dump(2);
  EXPECT_EQ(s["pool"]["quarantined"], kOldPrimaryBlocks) << s["pool"].dump(2);
}

// The old primary's blocks past its barrier: freed, the reserve refilled from them, the rest
// granted to the new primary, the pair settled again with a new standby.
json ExpectHandedOn(const ChaosCluster& cluster, const json& heir) {
  const json s = cluster.WaitFor(
      [&](const json& st) {
        return Settled(st) && PrimaryId(st) == heir["id"].get<uint64_t>() &&
               !st["controller"]["recovery"]["in_progress"].get<bool>();
      },
      "the old primary's blocks handed on past its barrier");
  const json p = EngineWithRole(s, "primary");
  EXPECT_EQ(PidOf(p), PidOf(heir));
  EXPECT_EQ(p["blocks"], kOldPrimaryBlocks) << s["pool"].dump(2);
  EXPECT_EQ(s["pool"]["promotion_reserve"]["available"], kReserve);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // a few rounds of fill checks
  ExpectHealthy(cluster, s);
  return s;
}

// The worker lives on through the restart: the next controller finds the old primary gone
// but its group not empty, and holds its blocks back until the worker is.
// A pair in the middle of a failover (FailOverWithAFrozenWorker: the promoted engine serves,
// the old primary's worker frozen), then its controller killed with kill -9. `heir_` is the
// promoted engine.
class RestartMidBarrierServing : public ::testing::Test {
 protected:
  void SetUp() override {
    m_ = FailOverWithAFrozenWorker(cluster_, frozen_);
    if (!m_.skip.empty()) GTEST_SKIP() << m_.skip;
    ASSERT_FALSE(m_.status.is_null());
    heir_ = EngineWithRole(m_.status, "primary");
    cluster_.KillController();
  }

  ChaosCluster cluster_{Options()};
  FrozenProcess frozen_;  // destroyed (thawed) before the cluster stops
  MidFailover m_;
  json heir_;
};

TEST_F(RestartMidBarrierServing, TheOldPrimarysBlocksWaitForItsWorkerAcrossTheRestart) {
  cluster_.StartControllerAgain();
  const json held = cluster_.WaitFor(
      [&](const json& s) {
        return PrimaryId(s) == heir_["id"].get<uint64_t>() &&
               !s["controller"]["recovery"]["readopted"].empty();
      },
      "the promoted engine re-adopted as the primary");
  ExpectHeldBack(held, heir_);
  // Still held a while later: nothing but the worker's exit lets them move.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  ExpectHeldBack(cluster_.Status(), heir_);
  EXPECT_TRUE(ProcessRunning(m_.worker));
  frozen_.Thaw();
  EXPECT_TRUE(WaitGone(m_.worker)) << "the thawed worker did not die";
  ExpectHandedOn(cluster_, heir_);
}

// The worker dies while no controller runs: the next one finds the old primary's group and
// cgroup empty and hands its blocks on as soon as its recovery ends.
TEST_F(RestartMidBarrierServing, AWorkerGoneWhileNoControllerRanFreesTheBlocksAtTheRestart) {
  frozen_.Thaw();
  ASSERT_TRUE(WaitGone(m_.worker)) << "the thawed worker did not die";
  cluster_.StartControllerAgain();
  ExpectHandedOn(cluster_, heir_);
}

// A file that exists from Create() until Remove() or its destruction (the test engines'
// --promote-hold-file).
class HoldFile {
 public:
  explicit HoldFile(std::string path) : path_(std::move(path)) {}
  ~HoldFile() { Remove(); }
  void Create() const { std::ofstream(path_) << "hold\n"; }
  void Remove() const { ::unlink(path_.c_str()); }

 private:
  std::string path_;
};

// The controller dies before the promoted engine says it serves (the test holds its start
// until it has seen the Grant): the next one re-adopts it as promoted, the heir of the old
// primary's blocks, and grants them to it once the worker is gone
// (RecoveryPart::GrantInheritance), not before.
TEST(RestartMidBarrier, AnEnginePromotedBeforeTheBarrierInheritsOnlyPastIt) {
  const std::string hold_path =
      "/tmp/baton-chaos-promote-hold-" + std::to_string(::getpid()) + ".txt";
  ChaosCluster cluster(Options(hold_path));
  const HoldFile hold(hold_path);
  FrozenProcess frozen;
  hold.Create();  // the standby, once promoted, does not say it serves until it is removed
  const MidFailover m = FailOverWithAFrozenWorker(cluster, frozen, /*serving=*/false);
  if (!m.skip.empty()) GTEST_SKIP() << m.skip;
  ASSERT_FALSE(m.status.is_null());
  const json heir = EngineWithRole(m.status, "promoting");
  const uint64_t heir_id = heir["id"];
  cluster.KillController();
  cluster.StartControllerAgain();
  const json held = cluster.WaitFor(
      [&](const json& s) {
        const json p = EngineWithRole(s, "promoting");
        return !p.is_null() && p["id"] == heir_id && p["adopted"].get<bool>();
      },
      "the promoted engine re-adopted as promoted");
  const std::string owed = "engine " + std::to_string(heir_id) + " was promoted before engine " +
                           std::to_string(m.old_primary) + "'s barrier";
  EXPECT_NE(cluster.Log().find(owed), std::string::npos) << cluster.Log();
  const auto expect_held = [&](const json& s) {
    const json p = EngineWithRole(s, "promoting");
    ASSERT_FALSE(p.is_null()) << s.dump(2);
    EXPECT_EQ(PidOf(p), PidOf(heir)) << "the same process, re-adopted";
    EXPECT_EQ(p["blocks"], kReserve) << "the old primary's blocks granted before its barrier";
    EXPECT_EQ(s["pool"]["free"], 0) << s["pool"].dump(2);
    EXPECT_EQ(s["pool"]["granted"], kReserve) << s["pool"].dump(2);
    EXPECT_EQ(s["pool"]["quarantined"], kOldPrimaryBlocks) << s["pool"].dump(2);
  };
  expect_held(held);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  expect_held(cluster.Status());
  EXPECT_TRUE(ProcessRunning(m.worker));
  frozen.Thaw();
  EXPECT_TRUE(WaitGone(m.worker)) << "the thawed worker did not die";
  cluster.WaitFor(
      [&](const json& s) {
        const json p = EngineWithRole(s, "promoting");
        return !p.is_null() && p["id"] == heir_id && p["blocks"] == kBlocks;
      },
      "the old primary's blocks granted to the heir, still promoting");
  EXPECT_NE(cluster.Log().find(std::to_string(kOldPrimaryBlocks) +
                               " blocks of the previous controller's failover, past their "
                               "barrier, granted to engine " +
                               std::to_string(heir_id)),
            std::string::npos)
      << cluster.Log();
  hold.Remove();  // it serves now; the reserve is refilled from it
  ExpectHandedOn(cluster, heir);
  // The heir was granted them with no worker of the old primary left (it checks at the Grant).
  std::string inherited;
  std::getline(std::ifstream(cluster.dir() + "/inherited-" + std::to_string(heir_id) + ".txt"),
               inherited);
  EXPECT_EQ(inherited, std::to_string(kOldPrimaryBlocks) +
                           " blocks; workers of other engines still running: 0");
}

}  // namespace
}  // namespace baton::chaos
