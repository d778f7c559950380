// The promotion drill on the CPU: a failover that does not wait for the dead primary's
// teardown. The engines are multi-process (the test engine forks a worker after its promotion
// that maps its blocks, holds 1 GiB and writes into its blocks until it is killed:
// engine_worker.h), and every engine fills the blocks it holds whole and checks them for a
// foreign word. The primary's main process is killed; its worker writes on until the fence's
// SIGKILL reaches it and then takes a while to exit. The standby is promoted on the promotion
// reserve at once, before that exit; the dead primary's blocks stay quarantined until its
// process group and cgroup are empty, and only then are they granted to the new primary.
#include <gtest/gtest.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <thread>

#include "tests/chaos/chaos_harness.h"
#include "tests/chaos/engine_worker.h"

namespace baton::chaos {
namespace {

constexpr int kBlocks = 16;
constexpr int kReserve = 4;
constexpr uint64_t kWorkerMb = 1024;

uint64_t MonotonicNs() {
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<uint64_t>(now.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(now.tv_nsec);
}

TEST(QuarantineDrill, PromotedBeforeTheDyingEnginesTeardownWithNoForeignByte) {
  ClusterOptions options;
  options.blocks = kBlocks;
  options.promotion_reserve_blocks = kReserve;
  options.engine_args = {"--fill-blocks", "--worker-mb", std::to_string(kWorkerMb)};
  ChaosCluster cluster(options);
  const json before = cluster.Status();
  const json primary = EngineWithRole(before, "primary");
  ASSERT_FALSE(primary.is_null());
  EXPECT_EQ(before["pool"]["promotion_reserve"]["target"], kReserve) << before["pool"].dump(2);
  EXPECT_EQ(before["pool"]["promotion_reserve"]["available"], kReserve);
  EXPECT_EQ(primary["blocks"], kBlocks - kReserve) << "the reserve stays out of the primary's";
  const uint64_t old_id = primary["id"];
  const pid_t worker = testing::WorkerPid(cluster.dir(), old_id);
  ASSERT_GT(worker, 0) << "the primary's worker never started";
  ASSERT_TRUE(ProcessRunning(worker));
  // Its memory held, so that its exit takes a while (1 GiB: tens of milliseconds or more).
  for (int i = 0; i < 2000 && testing::ResidentMb(worker) < kWorkerMb; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_GE(testing::ResidentMb(worker), kWorkerMb);
  cluster.CheckFencing();

  const uint64_t killed_ns = MonotonicNs();
  ASSERT_EQ(::kill(PidOf(primary), SIGKILL), 0);  // its main process only: the fence does the rest
  const json after = WaitNewPrimary(cluster, old_id, "the standby to take over");
  const json settled = cluster.WaitFor(
      [](const json& s) {
        return IsReady(s) && s["pool"]["quarantined"] == 0 &&
               s["pool"]["promotion_reserve"]["available"] == kReserve;
      },
      "the quarantine to drain and the reserve to come back");
  EXPECT_FALSE(ProcessRunning(worker)) << "the worker outlived the fence";

  const json t = cluster.Ctl({"timeline"}).out["timeline"];
  ASSERT_EQ(t["old_engine"], old_id) << t.dump(2);
  EXPECT_TRUE(t["promotion"]["before_barrier"].get<bool>()) << t.dump(2);
  EXPECT_EQ(t["promotion"]["reserve_blocks"], kReserve);
  EXPECT_EQ(t["promotion"]["quarantined_blocks"], kBlocks - kReserve);
  const json& stamps = t["stamps"];
  // The Promote went out before the barrier could pass: the worker was still in the group.
  EXPECT_LT(stamps["promote_sent_ms"].get<double>(), stamps["barrier_passed_ms"].get<double>());
  EXPECT_LE(stamps["reaped_ms"].get<double>(), stamps["barrier_passed_ms"].get<double>());
  ASSERT_TRUE(t["phases"].contains("teardown_ms"));
  std::printf(
      "drill: ready %.2f ms, teardown %.2f ms (acked %.2f ms, barrier %.2f ms after the "
      "first stamp); the worker's last write %.3f ms after its engine's kill\n",
      t["phases"]["ready_ms"].get<double>(), t["phases"]["teardown_ms"].get<double>(),
      stamps["promote_acked_ms"].get<double>(), stamps["barrier_passed_ms"].get<double>(),
      (static_cast<double>(testing::EngineWorker::LastWrite(cluster.dir(), old_id)) -
       static_cast<double>(killed_ns)) /
          1e6);
  EXPECT_GT(testing::EngineWorker::LastWrite(cluster.dir(), old_id), 0u) << "the worker wrote";

  // The new primary was granted the old blocks once past the barrier, with no worker of the
  // old engine left (it checks at the Grant and writes what it saw).
  const uint64_t new_id = PrimaryId(settled);
  std::string inherited;
  std::getline(std::ifstream(cluster.dir() + "/inherited-" + std::to_string(new_id) + ".txt"),
               inherited);
  EXPECT_EQ(inherited, std::to_string(kBlocks - kReserve) +
                           " blocks; workers of other engines still running: 0");
  const json p = EngineWithRole(settled, "primary");
  EXPECT_EQ(p["blocks"], kBlocks - kReserve)
      << "the quarantined blocks joined it, the reserve back";
  // Foreign words (fill checks) and headers of another engine would be violation files.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // a few rounds of checks
  cluster.CheckFencing();
}
// The reserve is refilled from the new primary with one Reclaim, even when the primary is
// slow to answer it: asked twice, it would give up twice the blocks, and the reserve would
// keep them from it.
TEST(QuarantineDrill, TheReserveIsRefilledOnceFromAPrimarySlowToAnswer) {
  ClusterOptions options;
  options.blocks = kBlocks;
  options.promotion_reserve_blocks = kReserve;
  options.engine_args = {"--reclaim-delay-ms", "1500"};
  ChaosCluster cluster(options);
  const json primary = EngineWithRole(cluster.Status(), "primary");
  ASSERT_EQ(::kill(PidOf(primary), SIGKILL), 0);
  WaitNewPrimary(cluster, primary["id"], "the standby to take over");
  cluster.WaitFor(Settled, "the reserve to be whole again");
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // a second answer would be in
  const json s = cluster.WaitFor(Settled, "the pair to stay settled");
  EXPECT_EQ(EngineWithRole(s, "primary")["blocks"], kBlocks - kReserve) << s["pool"].dump(2);
  EXPECT_EQ(s["pool"]["free"], kReserve);
  size_t asked = 0;
  const std::string log = cluster.Log();
  for (size_t at = log.find("the promotion reserve holds"); at != std::string::npos;
       at = log.find("the promotion reserve holds", at + 1)) {
    ++asked;
  }
  EXPECT_EQ(asked, 1u) << log;
  cluster.CheckFencing();
}

// With no promotion reserve the promotion waits for the barrier, as the log and status say,
// and takes the old primary's blocks with its Promote.
TEST(QuarantineDrill, WithoutAReserveThePromotionWaitsForTheBarrier) {
  ClusterOptions options;
  options.promotion_reserve_blocks = 0;
  ChaosCluster cluster(options);
  const json before = cluster.Status();
  EXPECT_EQ(before["pool"]["promotion_reserve"]["target"], 0) << before["pool"].dump(2);
  EXPECT_NE(before["pool"]["promotion_reserve"]["note"].get<std::string>().find(
                "promotion_reserve_blocks = 0"),
            std::string::npos);
  const json primary = EngineWithRole(before, "primary");
  ASSERT_EQ(::kill(PidOf(primary), SIGKILL), 0);
  WaitNewPrimary(cluster, primary["id"], "the standby to take over");
  const json t = cluster.Ctl({"timeline"}).out["timeline"];
  EXPECT_FALSE(t["promotion"]["before_barrier"].get<bool>()) << t.dump(2);
  EXPECT_LE(t["stamps"]["reaped_ms"].get<double>(), t["stamps"]["promote_sent_ms"].get<double>())
      << "blocks moved before the old holder was reaped";
  EXPECT_NE(cluster.Log().find("a promotion waits for the old primary's barrier"),
            std::string::npos);
  cluster.CheckFencing();
}

}  // namespace
}  // namespace baton::chaos
