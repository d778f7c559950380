// The CUDA backend end to end between real processes, on the emulated device: a real
// baton-controller with `[gpu] backend = "cuda"` owns the device weights and pool, the SDK
// test engines take them (checking that the device weights equal the arena) and stamp block
// headers in the device pool; kill -9 of the primary promotes the standby onto the same
// device pool, which finds every header scrubbed or its own (fencing rules 1 and 2).
// Engines that compute on the host decline the device memory and the pair runs as before.
#include <gtest/gtest.h>
#include <signal.h>

#include "tests/chaos/chaos_harness.h"
#include "tests/cuda_emulated/emulated_device.h"

namespace baton::chaos {
namespace {

ClusterOptions CudaCluster(std::vector<std::string> engine_args) {
  ClusterOptions o;
  o.gpu_backend = "cuda";
  o.blocks = 8;
  o.block_bytes = 1 << 20;
  o.engine_args = std::move(engine_args);
  return o;
}

TEST(DevicePairTest, EnginesTakeTheDeviceMemoryAndAFailoverKeepsItFenced) {
  ChaosCluster cluster(CudaCluster({"--device-memory"}));
  const json before = cluster.Status();
  ASSERT_EQ(before["device"]["backend"], "cuda") << before.dump(2);
  EXPECT_EQ(before["device"]["pool_bytes"], 8 << 20);
  EXPECT_EQ(before["device"]["pool_chunks"], 1) << "a small pool is one chunk";
  for (const json& e : before["engines"]) EXPECT_EQ(e["device_memory"], "mapped") << e.dump();
  const json primary = EngineWithRole(before, "primary");
  ASSERT_FALSE(primary.is_null());
  cluster.CheckFencing();

  ASSERT_EQ(::kill(PidOf(primary), SIGKILL), 0);
  const json after = cluster.WaitFor(
      [&](const json& s) { return IsReady(s) && PrimaryId(s) != primary["id"].get<uint64_t>(); },
      "the standby to take over on the device pool");
  EXPECT_EQ(after["pool"]["granted"], 8);
  for (const json& e : after["engines"]) EXPECT_EQ(e["device_memory"], "mapped") << e.dump();
  // Let the new primary stamp its blocks: a header left by the dead primary would be a
  // violation the engine writes down, which CheckFencing looks for.
  cluster.WaitFor([](const json& s) { return EngineWithRole(s, "primary")["heartbeats"] > 20; },
                  "the new primary to run a while");
  cluster.CheckFencing();
  EXPECT_NE(cluster.Log().find("device memory: device 0: weights"), std::string::npos);
}

TEST(DevicePairTest, HostEnginesDeclineTheDeviceMemory) {
  ChaosCluster cluster(CudaCluster({}));
  const json s = cluster.Status();
  ASSERT_EQ(s["device"]["backend"], "cuda");
  for (const json& e : s["engines"]) {
    EXPECT_NE(e["device_memory"].get<std::string>().find("declined: this engine computes on "
                                                         "the host"),
              std::string::npos)
        << e.dump();
  }
  EXPECT_NE(cluster.Log().find("declined device region 'pool'"), std::string::npos);
  cluster.CheckFencing();
}

}  // namespace
}  // namespace baton::chaos
