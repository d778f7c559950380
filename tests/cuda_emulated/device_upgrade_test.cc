// Canary upgrades on the CUDA backend, between real processes on the emulated device. The
// driver maps the device pool by whole chunks, so the controller lends the canary whole
// chunks only, which the primary returns whole: both engines stamp the block headers of what
// they hold in the device pool, and any header written by the other engine in a block one of
// them holds (a chunk both map) is a violation they write down, which CheckFencing looks for.
// A pair of reference engines behind the router also goes through a whole upgrade on chunks,
// under load.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include "tests/chaos/chaos_harness.h"
#include "tests/chaos/router_load.h"
#include "tests/chaos/upgrade_support.h"
#include "tests/cuda_emulated/emulated_device.h"

namespace baton::chaos {
namespace {

using std::chrono::seconds;

// `blocks` blocks of 1 MiB in chunks of `chunk_bytes`, engines that take the device memory.
ClusterOptions ChunkedCluster(uint64_t chunk_bytes, int blocks = 16) {
  ClusterOptions o;
  o.gpu_backend = "cuda";
  o.blocks = blocks;
  o.block_bytes = 1 << 20;
  o.gpu_pool_chunk_bytes = chunk_bytes;
  o.engine_args = {"--device-memory"};
  return o;
}

// The chunks (of two blocks) that `engine`'s leases touch.
std::vector<int> ChunksOf(const json& engine) {
  std::vector<int> chunks;
  for (const json& x : engine["extents"]) {
    const int first = x[0].get<int>();
    for (int b = first; b < first + x[1].get<int>(); ++b) {
      if (chunks.empty() || chunks.back() != b / 2) chunks.push_back(b / 2);
    }
  }
  return chunks;
}

// 16 blocks in 8 chunks of 2: the canary's half is 4 whole chunks.
TEST(DeviceUpgradeTest, TheCanaryGetsWholeChunksAndARollbackGivesThemBack) {
  ChaosCluster cluster(ChunkedCluster(2 << 20));
  ASSERT_EQ(cluster.Status()["device"]["pool_chunks"], 8);
  const json s = CanaryOfTheSameCommand(cluster);
  const json primary = EngineWithRole(s, "primary");
  const json canary = EngineWithRole(s, "canary");
  EXPECT_EQ(primary["blocks"], 8) << s.dump();
  EXPECT_EQ(canary["device_memory"], "mapped") << canary.dump();
  const std::vector<int> mine = ChunksOf(primary);
  ASSERT_EQ(ChunksOf(canary).size(), 4u) << canary.dump();
  for (int c : ChunksOf(canary)) {
    EXPECT_EQ(std::count(mine.begin(), mine.end(), c), 0) << "chunk " << c << " is shared";
  }
  // Both engines stamp their device blocks a while: a chunk mapped by both would show.
  const uint64_t beats = canary["heartbeats"].get<uint64_t>();
  cluster.WaitFor(
      [&](const json& st) { return EngineWithRole(st, "canary")["heartbeats"] > beats + 10; },
      "the canary to run a while");
  cluster.CheckFencing();

  const CtlResult back = cluster.Ctl({"rollback"});
  ASSERT_EQ(back.exit_code, 0) << back.stdout_text;
  const json after = cluster.WaitFor(
      [](const json& st) {
        return !st["upgrade"]["history"].empty() && Settled(st) &&
               st["pool"]["free"] == st["pool"]["promotion_reserve"]["target"] &&
               EngineWithRole(st, "primary")["blocks"] == BlocksBesideTheReserve(st);
      },
      "the rollback, the canary's chunks back with the primary (the reserve's chunk kept free)",
      seconds(30));
  EXPECT_EQ(after["upgrade"]["history"][0]["outcome"], "rolled_back");
  cluster.CheckFencing();
}

TEST(DeviceUpgradeTest, APrimaryKilledMidCanaryHandsItsChunksToTheCanary) {
  ChaosCluster cluster(ChunkedCluster(2 << 20));
  const json s = CanaryOfTheSameCommand(cluster);
  const json primary = EngineWithRole(s, "primary");
  const uint64_t canary = EngineWithRole(s, "canary")["id"];
  ASSERT_EQ(::kill(PidOf(primary), SIGKILL), 0);
  const json after = cluster.WaitFor(
      [&](const json& st) {
        return Settled(st) && PrimaryId(st) == canary &&
               EngineWithRole(st, "primary")["blocks"] == BlocksBesideTheReserve(st);
      },
      "the canary to take over the device pool but the reserve's chunk", seconds(30));
  EXPECT_EQ(after["upgrade"]["history"][0]["outcome"], "promoted") << after.dump();
  // The dead primary's chunks are scrubbed for the canary: a header of the dead primary
  // found in one would be a violation.
  cluster.WaitFor([&](const json& st) { return EngineWithRole(st, "primary")["heartbeats"] > 40; },
                  "the new primary to run a while");
  cluster.CheckFencing();
}

// 18 blocks in chunks of 4, the last one short ([16, 18)), and a single 100 % step: the
// primary returns whole chunks, the short one first, but never more than asked, and is never
// asked for what it keeps: it serves on with its last chunk, the canary has the other 14.
TEST(DeviceUpgradeTest, AtAFullShareThePrimaryKeepsAChunk) {
  ChaosCluster cluster(ChunkedCluster(4 << 20, 18));
  ASSERT_EQ(cluster.Status()["device"]["pool_chunks"], 5);
  const json s = CanaryOfTheSameCommand(cluster, "100", 14);
  EXPECT_EQ(EngineWithRole(s, "primary")["blocks"], 4) << s.dump();
  std::this_thread::sleep_for(seconds(3));  // past the next Reclaim (every 2 s while short)
  const json later = cluster.Status();
  EXPECT_EQ(EngineWithRole(later, "primary")["blocks"], 4) << later.dump();
  EXPECT_EQ(EngineWithRole(later, "canary")["blocks"], 14) << later.dump();
  cluster.CheckFencing();
}

TEST(DeviceUpgradeTest, APoolOfOneChunkRefusesAnUpgradeAndSaysWhy) {
  ChaosCluster cluster(ChunkedCluster(0));  // the default: one chunk holds this small pool
  ASSERT_EQ(cluster.Status()["device"]["pool_chunks"], 1);
  const CtlResult up = cluster.Ctl({"upgrade", "--", "/bin/true"});
  EXPECT_EQ(up.exit_code, 1) << up.stdout_text;
  EXPECT_NE(up.stdout_text.find("a canary needs a chunk of its own"), std::string::npos)
      << up.stdout_text;
  EXPECT_NE(up.stdout_text.find("gpu.pool_chunk_bytes"), std::string::npos) << up.stdout_text;
  EXPECT_TRUE(cluster.Status()["upgrade"]["current"].is_null());
  cluster.CheckFencing();
}

// The whole upgrade on a chunked device pool, with reference engines behind the router under
// load: the canary passes its steps on whole chunks, the old primary drains, and the canary
// takes over the pool; no request is lost. (The reference engine computes on the host and
// declines the device regions; the ledger lends by chunks all the same.)
TEST(DeviceUpgradeTest, AReferencePairUpgradesInWholeChunksUnderLoadLosingNoRequest) {
  ClusterOptions options = RefenginePair();
  options.gpu_backend = "cuda";
  options.gpu_pool_chunk_bytes = 2 << 20;  // 16 chunks of 32 blocks
  ChaosCluster cluster(options);
  ASSERT_EQ(cluster.Status()["device"]["pool_chunks"], 16);
  RouterProcess router(cluster.socket(), cluster.dir());
  ASSERT_TRUE(router.ready()) << router.Log();
  std::vector<json> requests;
  std::vector<StreamOutput> want;
  References(router.port(), "DeviceUpgrade", 32, &requests, &want);
  json promoted;
  const LoadResult r = LoadAround(router.port(), requests, want, [&] {
    promoted = UpgradeToTheEnd(cluster, {"--engine-version", "refengine-v2"});
  });
  ExpectNoFailure(r, router);
  EXPECT_EQ(promoted["outcome"], "promoted") << promoted.dump();
  const json s = cluster.WaitFor(
      [](const json& st) {
        return Settled(st) && st["pool"]["free"] == st["pool"]["promotion_reserve"]["target"];
      },
      "the new primary to hold the whole pool but the promotion reserve");
  EXPECT_EQ(EngineWithRole(s, "primary")["version"], "refengine-v2") << s.dump();
  cluster.CheckFencing();
}

}  // namespace
}  // namespace baton::chaos
