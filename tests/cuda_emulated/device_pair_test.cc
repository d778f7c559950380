// The CUDA backend end to end between real processes, on the emulated device: a real
// baton-controller with `[gpu] backend = "cuda"` owns the device weights and pool, the SDK
// test engines take them (checking that the device weights equal the arena) and stamp block
// headers in the device pool; kill -9 of the primary promotes the standby onto the same
// device pool, which finds every header scrubbed or its own (fencing rules 1 and 2).
// Engines that compute on the host decline the device memory and the pair runs as before.
// Canary upgrades on the device pool: device_upgrade_test.cc.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <thread>

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

// Sets an environment variable for the processes started while it lives.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() { ::unsetenv(name_); }

 private:
  const char* name_;
};

// `batonctl status` as an operator reads it (text, not --json).
std::string TextStatus(const ChaosCluster& cluster) {
  const std::string cmd =
      std::string(BATON_BIN_DIR) + "/batonctl --socket " + cluster.socket() + " status";
  std::string out;
  if (FILE* p = ::popen(cmd.c_str(), "r")) {
    char buf[4096];
    while (std::fgets(buf, sizeof(buf), p) != nullptr) out += buf;
    ::pclose(p);
  }
  return out;
}

bool WaitForLog(const ChaosCluster& cluster, const std::string& text) {
  for (int i = 0; i < 2000; ++i) {
    if (cluster.Log().find(text) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

TEST(DevicePairTest, BlocksWaitUntilNvmlNoLongerListsTheReapedPrimary) {
  const std::string pids = "/tmp/baton-nvml-" + std::to_string(::getpid()) + ".pids";
  std::ofstream(pids).close();
  ScopedEnv env("BATON_FAKE_NVML_PIDS", pids);
  ChaosCluster cluster(CudaCluster({"--device-memory"}));
  const json before = cluster.Status();
  const json primary = EngineWithRole(before, "primary");
  const uint64_t standby = EngineWithRole(before, "standby")["id"];
  std::ofstream(pids) << PidOf(primary) << "\n";  // the driver has not let go of it yet

  ASSERT_EQ(::kill(PidOf(primary), SIGKILL), 0);
  ASSERT_TRUE(WaitForLog(cluster, "but NVML still lists it on GPU 0000:00:00.0")) << cluster.Log();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const json waiting = cluster.Status();
  EXPECT_TRUE(EngineWithRole(waiting, "primary").is_null())
      << "promoted while the old primary was still on the GPU: " << waiting.dump(2);
  EXPECT_FALSE(ProcessExists(PidOf(primary))) << "it is reaped all the same";

  std::ofstream(pids).close();  // the driver released it
  const json after =
      cluster.WaitFor([&](const json& s) { return IsReady(s) && PrimaryId(s) == standby; },
                      "the standby to take over once NVML let go");
  const json t = cluster.Ctl({"timeline"}).out["timeline"];
  ASSERT_TRUE(t["stamps"].contains("gpu_released_ms")) << t.dump(2);
  EXPECT_GE(t["stamps"]["gpu_released_ms"].get<double>(), t["stamps"]["reaped_ms"].get<double>());
  EXPECT_LE(t["stamps"]["gpu_released_ms"].get<double>(),
            t["stamps"]["promote_sent_ms"].get<double>());
  EXPECT_NE(cluster.Log().find("barrier: NVML no longer lists pid"), std::string::npos);
  cluster.CheckFencing();
  std::remove(pids.c_str());
}

// With a pool of several chunks the standby is promoted at once on the promotion reserve (a
// chunk the dead primary never held) while NVML still lists the primary: its chunks stay
// quarantined until NVML lets go, and only then are they granted to the new primary.
// Meanwhile the new primary reads them through the SDK's read-only mapping of their chunks
// (--read-quarantine), as an engine that copies their KV device to device does, and keeps
// that mapping until their grant makes the chunks writable in place: its stamps land there.
TEST(DevicePairTest, APromotionBeforeNvmlLetsGoKeepsTheOldChunksQuarantined) {
  const std::string pids = "/tmp/baton-nvml-q-" + std::to_string(::getpid()) + ".pids";
  std::ofstream(pids).close();
  ScopedEnv env("BATON_FAKE_NVML_PIDS", pids);
  ClusterOptions options = CudaCluster({"--device-memory", "--read-quarantine"});
  options.gpu_pool_chunk_bytes = 2 << 20;  // 4 chunks of 2 blocks
  options.promotion_reserve_blocks = 2;
  ChaosCluster cluster(options);
  const json before = cluster.Status();
  ASSERT_EQ(before["device"]["pool_chunks"], 4) << before.dump(2);
  EXPECT_EQ(before["pool"]["promotion_reserve"]["available"], 2) << before["pool"].dump(2);
  const json primary = EngineWithRole(before, "primary");
  EXPECT_EQ(primary["blocks"], 6);
  const uint64_t standby = EngineWithRole(before, "standby")["id"];
  std::ofstream(pids) << PidOf(primary) << "\n";  // the driver has not let go of it yet

  ASSERT_EQ(::kill(PidOf(primary), SIGKILL), 0);
  const json early = cluster.WaitFor(
      [&](const json& s) {
        const json p = EngineWithRole(s, "primary");
        return !p.is_null() && p["id"] == standby && p["serving"] == true;
      },
      "the standby to serve on the reserve while NVML lists the old primary");
  EXPECT_EQ(EngineWithRole(early, "primary")["blocks"], 2) << early.dump(2);
  EXPECT_EQ(early["pool"]["quarantined"], 6) << "the old primary's chunks wait for NVML";
  ASSERT_TRUE(WaitForLog(cluster, "but NVML still lists it on GPU 0000:00:00.0")) << cluster.Log();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(cluster.Status()["pool"]["quarantined"], 6) << "nothing moves while NVML lists it";
  std::string read;
  std::getline(
      std::ifstream(cluster.dir() + "/quarantine-read-" + std::to_string(standby) + ".txt"), read);
  EXPECT_EQ(read, "read 6 blocks; stamped by another engine: 6")
      << "the dead primary's last stamps, read in its quarantined chunks\n"
      << cluster.Log();

  std::ofstream(pids).close();  // the driver released it
  const json after = cluster.WaitFor(Settled, "the old chunks to reach the new primary");
  EXPECT_EQ(EngineWithRole(after, "primary")["blocks"], 6) << after.dump(2);
  // Their Grant carries the headers the dead primary left (its KV records lie in the host pool
  // blocks of the same numbers), for an engine that adopts its KV in place.
  std::string inherited;
  std::getline(std::ifstream(cluster.dir() + "/inherited-" + std::to_string(standby) + ".txt"),
               inherited);
  EXPECT_EQ(inherited, "6 blocks; workers of other engines still running: 0") << cluster.Log();
  const json t = cluster.Ctl({"timeline"}).out["timeline"];
  EXPECT_TRUE(t["promotion"]["before_barrier"].get<bool>()) << t.dump(2);
  EXPECT_LT(t["stamps"]["promote_acked_ms"].get<double>(),
            t["stamps"]["gpu_released_ms"].get<double>());
  EXPECT_LE(t["stamps"]["gpu_released_ms"].get<double>(),
            t["stamps"]["barrier_passed_ms"].get<double>());
  EXPECT_GT(t["phases"]["teardown_ms"].get<double>(), t["phases"]["ready_ms"].get<double>());
  cluster.WaitFor([](const json& s) { return EngineWithRole(s, "primary")["heartbeats"] > 20; },
                  "the new primary stamps its blocks");
  EXPECT_EQ(EngineWithRole(cluster.Status(), "primary")["id"], standby)
      << "the chunks it had read are writable: its stamps there did not fault";
  cluster.CheckFencing();
  std::remove(pids.c_str());
}

// NVML that lists no engine although each mapped device memory (the controller in another
// PID namespace than the pids NVML reports) makes the barrier's GPU half blind: the
// controller says so in its log and in `status`.
TEST(DevicePairTest, AnNvmlThatCannotSeeTheEnginesIsReported) {
  const std::string pids = "/tmp/baton-nvml-blind-" + std::to_string(::getpid()) + ".pids";
  std::ofstream(pids).close();
  ScopedEnv env("BATON_FAKE_NVML_PIDS", pids);
  ChaosCluster cluster(CudaCluster({"--device-memory"}));
  EXPECT_TRUE(WaitForLog(cluster, "barrier: NVML does not list engine")) << cluster.Log();
  EXPECT_EQ(cluster.Status()["device"]["nvml_lists_engines"], false);
  std::remove(pids.c_str());
}

TEST(DevicePairTest, ALostDeviceFencesTheEnginesAndIsRebuiltFromThePinnedCache) {
  const std::string lost = "/tmp/baton-lost-" + std::to_string(::getpid());
  std::remove(lost.c_str());
  ScopedEnv env("BATON_FAKE_CUDA_LOST", lost);
  ClusterOptions options = CudaCluster({"--device-memory"});
  options.gpu_probe_ms = 50;
  ChaosCluster cluster(options);
  const json before = cluster.Status();
  ASSERT_EQ(before["device"]["lost"], false);

  std::ofstream(lost).close();  // an uncorrectable error: the device is gone until a reset
  const json down = cluster.WaitFor(
      [](const json& s) { return s["device"]["lost"] == true && s["engines"].empty(); },
      "the controller to see the device lost and fence both engines");
  EXPECT_EQ(down["device"]["losses"], 1);
  EXPECT_NE(down["device"]["last_loss"].get<std::string>().find("CUDA_ERROR_ECC_UNCORRECTABLE"),
            std::string::npos)
      << down["device"].dump();
  for (const json& e : before["engines"]) EXPECT_FALSE(ProcessExists(PidOf(e)));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_TRUE(cluster.Status()["engines"].empty()) << "no engine starts on a lost device";
  EXPECT_NE(TextStatus(cluster).find("device memory: LOST (device probe: cuMemcpyDtoHAsync: "
                                     "CUDA_ERROR_ECC_UNCORRECTABLE"),
            std::string::npos)
      << TextStatus(cluster);

  std::remove(lost.c_str());  // the reset is done
  const json after =
      cluster.WaitFor([](const json& s) { return IsReady(s) && s["device"]["rebuilds"] == 1; },
                      "the device memory rebuilt and a new pair on it");
  EXPECT_EQ(after["device"]["lost"], false);
  for (const json& e : after["engines"]) EXPECT_EQ(e["device_memory"], "mapped") << e.dump();
  EXPECT_NE(cluster.Log().find("device memory rebuilt from the pinned cache"), std::string::npos);
  cluster.CheckFencing();
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
