// What a restarted controller cannot prove it does not take: a roster that does not parse,
// kept memory the record does not name, a kept arena whose manifest does not parse, a corrupt
// epoch journal; and what baton-keeper does not let a stranger touch. The engines it cannot account
// for are fenced (or, without a roster, found by the memory they map) before anything moves; a
// journal it cannot trust stops it before it touches an engine. Real processes, real kill -9; every
// check goes through batonctl.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <string>

#include "base/process/proc_table.h"
#include "controller/keeper/keeper_client.h"
#include "tests/chaos/chaos_harness.h"
#include "tests/chaos/controller_restart_support.h"

namespace baton::chaos {
namespace {

// A roster that does not parse (neither slot): nothing the previous controller ran can be
// accounted for, so its engines are fenced (killed) before a new pair starts.
TEST(ControllerRestart, ACorruptRosterIsRefusedAndItsEnginesFenced) {
  ChaosCluster cluster;
  const json before = cluster.Status();
  cluster.KillController();
  CorruptBothRosterSlots(cluster);
  cluster.RestartController();
  const json after = cluster.WaitReady("a new pair");
  EXPECT_NE(after["controller"]["recovery"]["roster"].get<std::string>().find("refused"),
            std::string::npos)
      << after["controller"].dump();
  for (pid_t pid : EnginePids(before)) {
    EXPECT_EQ(EnginePids(after).count(pid), 0u) << "an unaccounted engine was kept";
  }
  ExpectHealthy(cluster, after);
}

// The same without engine cgroups, the old primary frozen (SIGSTOP, as a hung engine): no
// roster names the processes that map the kept memory, so the new controller finds them in
// /proc, kills them and waits for their exit before it adopts the memory; the new primary
// never shares a block with a writer that outlived its controller.
TEST(ControllerRestart, WithoutARosterWhateverHoldsTheKeptMemoryIsKilledFirst) {
  ClusterOptions o;
  o.engine_cgroup = "off";
  ChaosCluster cluster(o);
  const json before = cluster.Status();
  const pid_t old_primary = PidOf(EngineWithRole(before, "primary"));
  cluster.KillController();
  CorruptBothRosterSlots(cluster);
  ASSERT_EQ(::kill(old_primary, SIGSTOP), 0);
  cluster.RestartController();
  const json after = cluster.WaitReady("a new pair");
  const json& recovery = after["controller"]["recovery"];
  for (pid_t pid : EnginePids(before)) {
    EXPECT_FALSE(ProcessRunning(pid)) << "engine pid " << pid << " outlived the new start";
    EXPECT_EQ(EnginePids(after).count(pid), 0u);
    EXPECT_NE(
        std::find(recovery["holders_killed"].begin(), recovery["holders_killed"].end(), json(pid)),
        recovery["holders_killed"].end())
        << recovery.dump();
  }
  EXPECT_TRUE(after["pool"]["adopted"].get<bool>()) << "adopted once nothing else held it";
  EXPECT_NE(cluster.Log().find("no roster accounts for them"), std::string::npos);
  ExpectHealthy(cluster, after);
}

// A memory record that names other memory than the keeper holds: the weights are loaded
// afresh, and the engines, which map the old memory, are fenced.
TEST(ControllerRestart, KeptMemoryThatCannotBeProvenIsLoadedAfreshAndItsEnginesFenced) {
  ChaosCluster cluster;
  const json before = cluster.Status();
  cluster.KillController();
  std::ofstream(cluster.dir() + "/run/state/memory.json")
      << "{\"weights_generation\": 1, \"pool_generation\": 2}\n";
  cluster.RestartController();
  const json after = ExpectMemoryRefusedAndEnginesFenced(cluster, before, "not the ones");
  ExpectHealthy(cluster, after);
}

// A process of the controller's user that runs another program (here: this test) is refused
// by baton-keeper, with the reason: it can neither take the kept memory's fds nor replace a
// manifest. The next controller adopts everything, the same engines included.
TEST(ControllerRestart, TheKeeperRefusesAStrangerAndTheNextControllerAdoptsEverything) {
  ChaosCluster cluster;
  const json before = cluster.Status();
  const std::string controller_program = ProcessProgram(cluster.controller_pid());
  cluster.KillController();
  Result<KeeperClient> stranger = KeeperClient::Connect(cluster.dir() + "/run/keeper.sock", "", "");
  ASSERT_FALSE(stranger.ok());
  EXPECT_EQ(stranger.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(
      stranger.status().message().find("baton-keeper serves the controller (" + controller_program +
                                       ") only; pid " + std::to_string(::getpid()) + " runs "),
      std::string::npos)
      << stranger.status().message();
  cluster.RestartController();
  const json after = cluster.WaitFor([&](const json& s) { return SamePair(before, s); },
                                     "the same pair re-adopted");
  ExpectAdoptedMemory(after);
}

// A kept arena whose manifest does not parse (here: written by a diagnostic tool the operator
// let the keeper serve, BATON_KEEPER_CONTROLLERS) is refused with the reason; the weights are
// loaded afresh and the engines, which map the old arena, are fenced.
TEST(ControllerRestart, ACorruptArenaManifestIsRefusedAndTheWeightsLoadedAfresh) {
  ClusterOptions o;
  o.controller_env = {"BATON_KEEPER_CONTROLLERS=" + ProcessProgram(::getpid())};
  ChaosCluster cluster(o);
  const json before = cluster.Status();
  cluster.KillController();
  {
    Result<KeeperClient> keeper = KeeperClient::Connect(cluster.dir() + "/run/keeper.sock", "", "");
    ASSERT_TRUE(keeper.ok()) << keeper.status().ToString();
    Result<std::optional<KeptItem>> item = keeper->Fetch("weights");
    ASSERT_TRUE(item.ok() && item->has_value());
    ASSERT_TRUE(
        keeper->Keep("weights", "{\"format\": 1, \"generation\": [", {(*item)->fds[0].get()}).ok());
  }
  cluster.RestartController();
  const json after =
      ExpectMemoryRefusedAndEnginesFenced(cluster, before, "the kept weights' manifest");
  EXPECT_GT(after["weights"]["bytes_read"].get<uint64_t>(), 0u) << "loaded afresh";
  ExpectHealthy(cluster, after);
}

// A corrupt epoch journal: no epoch can be trusted, so the controller refuses to start and
// says why; the engines it would have re-adopted are not touched (they keep serving).
TEST(ControllerRestart, ACorruptJournalStopsTheControllerAndTouchesNoEngine) {
  ChaosCluster cluster;
  const json before = cluster.Status();
  cluster.KillController();
  std::ofstream(cluster.dir() + "/run/state/epoch.journal", std::ios::trunc) << "not a journal";
  cluster.StartControllerAgain();
  const int status = cluster.WaitControllerExit();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << "status " << status;
  EXPECT_NE(cluster.Log().find("epoch.journal"), std::string::npos) << cluster.Log();
  for (pid_t pid : EnginePids(before)) EXPECT_TRUE(ProcessRunning(pid)) << "engine " << pid;
}

}  // namespace
}  // namespace baton::chaos
