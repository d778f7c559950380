// A controller restart on the CUDA backend, on the emulated device between real processes:
// kill -9 of baton-controller leaves the device weights and the device pool in baton-keeper
// (their chunk fds), the next controller adopts them with the host memory and re-adopts the
// same pair, fencing nobody. Kept device memory that the memory record does not name is let
// go and made anew, and the engines that map the old memory are fenced with the reason.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "base/process/proc_table.h"
#include "tests/chaos/chaos_harness.h"
#include "tests/chaos/controller_restart_support.h"
#include "tests/cuda_emulated/emulated_device.h"

namespace baton::chaos {
namespace {

ClusterOptions CudaCluster() {
  ClusterOptions o;
  o.gpu_backend = "cuda";
  o.blocks = 8;
  o.block_bytes = 1 << 20;
  o.engine_args = {"--device-memory"};
  return o;
}

// The device generation <state_dir>/memory.json names (0: none kept).
uint64_t KeptDeviceGeneration(const ChaosCluster& cluster) {
  std::stringstream text;
  text << std::ifstream(cluster.dir() + "/run/state/memory.json").rdbuf();
  const json record = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  return record.is_object() && record.contains("device_generation")
             ? record["device_generation"].get<uint64_t>()
             : 0;
}

// Points the memory record at device memory baton-keeper does not keep, so that the next
// controller adopts the host memory and makes the device memory anew.
void MisnameKeptDevice(const ChaosCluster& cluster) {
  const std::string path = cluster.dir() + "/run/state/memory.json";
  std::stringstream text;
  text << std::ifstream(path).rdbuf();
  json record = json::parse(text.str());
  ASSERT_TRUE(record.contains("device_generation")) << record.dump();
  ASSERT_NE(record["device_generation"], 0) << "the first controller kept its device memory";
  record["device_generation"] = record["device_generation"].get<uint64_t>() ^ 1;
  std::ofstream(path) << record.dump() << "\n";
}

TEST(DeviceRestartTest, TheDeviceMemoryAndThePairSurviveKillMinusNine) {
  ChaosCluster cluster(CudaCluster());
  const json before = cluster.Status();
  ASSERT_EQ(before["device"]["backend"], "cuda") << before["device"].dump();
  EXPECT_FALSE(before["device"]["adopted"].get<bool>()) << "a first start makes it";
  cluster.CheckFencing();
  cluster.KillController();
  cluster.RestartController();
  const json after = cluster.WaitFor(
      [&](const json& s) {
        return IsReady(s) && PrimaryId(s) == PrimaryId(before) &&
               EnginePids(s) == EnginePids(before);
      },
      "the same pair, re-adopted on the kept device memory");
  EXPECT_TRUE(after["device"]["adopted"].get<bool>()) << after["device"].dump();
  EXPECT_EQ(after["device"]["pool_chunks"], before["device"]["pool_chunks"]);
  // Nothing is copied, so the adopted (read-only) arena is not pinned at all.
  EXPECT_EQ(before["device"]["pin"], "registered") << before["device"].dump();
  EXPECT_EQ(after["device"]["pin"], "not_needed") << after["device"].dump();
  const json& recovery = after["controller"]["recovery"];
  EXPECT_EQ(recovery["memory"], "adopted") << recovery.dump();
  EXPECT_TRUE(recovery["fenced"].empty()) << recovery.dump();
  // The engines acked their mappings to the previous controller; the roster carries them.
  for (const json& e : after["engines"]) EXPECT_EQ(e["device_memory"], "mapped") << e.dump();
  EXPECT_NE(cluster.Log().find("device memory adopted from baton-keeper"), std::string::npos);
  cluster.WaitFor([](const json& s) { return EngineWithRole(s, "primary")["heartbeats"] > 20; },
                  "the re-adopted primary to run a while");
  cluster.CheckFencing();
  EXPECT_EQ(after["invariants"], "ok") << after.dump();
}

// baton-keeper killed: the controller gives a new keeper the device chunks again (with the
// host memory) and names them in the record, so that a controller killed afterwards is
// followed by one that adopts the device memory and the same pair.
TEST(DeviceRestartTest, ADeadKeeperIsGivenTheDeviceMemoryAgain) {
  ChaosCluster cluster(CudaCluster());
  const json before = cluster.Status();
  const uint64_t generation = KeptDeviceGeneration(cluster);
  ASSERT_NE(generation, 0u) << "the first controller keeps its device memory";
  const pid_t keeper = cluster.KeeperPid();
  ASSERT_GT(keeper, 0);
  ASSERT_EQ(::kill(keeper, SIGKILL), 0);
  cluster.WaitFor(
      [&](const json& s) {
        const json& k = s["controller"]["keeper"];
        return k["state"] == "keeping" && k["restarts"] == 1 && k["pid"] != keeper;
      },
      "a new baton-keeper keeping the memory");
  const uint64_t again = KeptDeviceGeneration(cluster);
  EXPECT_NE(again, 0u) << "the device memory is kept again";
  EXPECT_NE(again, generation) << "under a new generation, named by the record";
  cluster.KillController();
  cluster.RestartController();
  const json after = cluster.WaitFor(
      [&](const json& s) {
        return IsReady(s) && PrimaryId(s) == PrimaryId(before) &&
               EnginePids(s) == EnginePids(before);
      },
      "the same pair, re-adopted on the device memory the new keeper kept");
  EXPECT_TRUE(after["device"]["adopted"].get<bool>()) << after["device"].dump();
  EXPECT_EQ(after["controller"]["recovery"]["memory"], "adopted") << after["controller"].dump();
  EXPECT_TRUE(after["controller"]["recovery"]["fenced"].empty()) << after["controller"].dump();
  cluster.CheckFencing();
}

TEST(DeviceRestartTest, KeptDeviceMemoryTheRecordDoesNotNameIsMadeAnewAndItsEnginesFenced) {
  ChaosCluster cluster(CudaCluster());
  const json before = cluster.Status();
  cluster.KillController();
  MisnameKeptDevice(cluster);
  cluster.RestartController();
  const json after = cluster.WaitFor(
      [&](const json& s) {
        return IsReady(s) && s["controller"]["recovery"]["fenced"].size() == 2;
      },
      "a new pair, the engines on the old device memory fenced");
  EXPECT_FALSE(after["device"]["adopted"].get<bool>());
  EXPECT_NE(after["device"]["adopted_reason"].get<std::string>().find("not the one"),
            std::string::npos)
      << after["device"].dump();
  EXPECT_NE(after["controller"]["recovery"]["memory"].get<std::string>().find("device memory"),
            std::string::npos)
      << after["controller"].dump();
  EXPECT_EQ(after["weights"]["load_method"], "adopted") << "the host memory was still proven";
  // The new device copy is made from the adopted arena, which this controller maps read-only.
  EXPECT_EQ(after["device"]["pin"], "registered_read_only") << after["device"].dump();
  for (pid_t pid : EnginePids(before)) EXPECT_EQ(EnginePids(after).count(pid), 0u);
  cluster.CheckFencing();
  // The new device memory is kept in its turn: the next restart adopts it.
  cluster.KillController();
  cluster.RestartController();
  const json again = cluster.WaitFor(
      [&](const json& s) { return IsReady(s) && EnginePids(s) == EnginePids(after); },
      "the new pair, re-adopted");
  EXPECT_TRUE(again["device"]["adopted"].get<bool>()) << again["device"].dump();
}

// A roster that cannot be read, engine cgroups off: the new controller finds the old engines
// by the kept memory they map and kills them, and, since their GPU work is not awaited there,
// makes the pool and the device memory anew (the weights stay adopted).
TEST(DeviceRestartTest, WithoutARosterTheKilledHoldersDeviceMemoryIsMadeAnew) {
  ClusterOptions o = CudaCluster();
  o.engine_cgroup = "off";
  ChaosCluster cluster(o);
  const json before = cluster.Status();
  cluster.KillController();
  CorruptBothRosterSlots(cluster);
  cluster.RestartController();
  const json after = cluster.WaitReady("a new pair on new device memory");
  EXPECT_EQ(after["controller"]["recovery"]["holders_killed"].size(), 2u)
      << after["controller"].dump();
  for (pid_t pid : EnginePids(before)) {
    EXPECT_FALSE(ProcessRunning(pid)) << "engine pid " << pid << " outlived the new start";
  }
  EXPECT_FALSE(after["pool"]["adopted"].get<bool>()) << after["pool"].dump();
  EXPECT_FALSE(after["device"]["adopted"].get<bool>()) << after["device"].dump();
  EXPECT_EQ(after["weights"]["load_method"], "adopted") << "the sealed weights stay";
  cluster.CheckFencing();
}

// A driver without read-only host registration cannot pin the adopted arena: the device copy
// is made from pageable memory instead, and the weights stay adopted.
TEST(DeviceRestartTest, WithoutReadOnlyRegistrationTheCopyIsMadeFromPageableMemory) {
  ChaosCluster cluster(CudaCluster());
  cluster.KillController();
  MisnameKeptDevice(cluster);
  ::setenv("BATON_FAKE_CUDA_NO_READ_ONLY_REGISTER", "1", 1);
  cluster.RestartController();
  ::unsetenv("BATON_FAKE_CUDA_NO_READ_ONLY_REGISTER");
  const json after = cluster.WaitFor(
      [](const json& s) { return IsReady(s) && s["controller"]["recovery"]["fenced"].size() == 2; },
      "a new pair on device memory made from the pageable arena");
  EXPECT_FALSE(after["device"]["adopted"].get<bool>());
  EXPECT_EQ(after["weights"]["load_method"], "adopted") << "not loaded afresh";
  EXPECT_EQ(after["device"]["pin"], "pageable") << after["device"].dump();
  EXPECT_NE(after["device"]["pinned"].get<std::string>().find("READ_ONLY_HOST_REGISTER_SUPPORTED"),
            std::string::npos)
      << after["device"].dump();
  EXPECT_NE(cluster.Log().find("the weight arena is not pinned"), std::string::npos);
  cluster.CheckFencing();
}

// A lost device's kept memory is let go (a successor must not adopt it, and the rebuild needs
// the room); the rebuilt memory is kept, and the next controller adopts that.
TEST(DeviceRestartTest, ALostDevicesMemoryIsLetGoAndTheRebuiltOneKept) {
  const std::string lost = "/tmp/baton-keep-lost-" + std::to_string(::getpid());
  std::remove(lost.c_str());
  ::setenv("BATON_FAKE_CUDA_LOST", lost.c_str(), 1);
  ClusterOptions options = CudaCluster();
  options.gpu_probe_ms = 50;
  ChaosCluster cluster(options);
  const uint64_t first = KeptDeviceGeneration(cluster);
  EXPECT_NE(first, 0u);
  std::ofstream(lost).close();
  cluster.WaitFor([](const json& s) { return s["device"]["lost"] == true; }, "the device lost");
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(KeptDeviceGeneration(cluster), 0u) << "the lost device memory is still recorded";
  std::remove(lost.c_str());
  const json rebuilt =
      cluster.WaitFor([](const json& s) { return IsReady(s) && s["device"]["rebuilds"] == 1; },
                      "the device memory rebuilt and a new pair on it");
  const uint64_t second = KeptDeviceGeneration(cluster);
  EXPECT_NE(second, 0u);
  EXPECT_NE(second, first);
  cluster.KillController();
  cluster.RestartController();
  const json after = cluster.WaitFor(
      [&](const json& s) { return IsReady(s) && EnginePids(s) == EnginePids(rebuilt); },
      "the pair on the rebuilt memory, re-adopted");
  EXPECT_TRUE(after["device"]["adopted"].get<bool>()) << after["device"].dump();
  cluster.CheckFencing();
  ::unsetenv("BATON_FAKE_CUDA_LOST");
}

}  // namespace
}  // namespace baton::chaos
