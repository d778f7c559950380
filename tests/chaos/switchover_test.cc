// Planned switch-overs and drains with real processes (a real baton-controller, the SDK test
// engine): `batonctl promote` hands the pair to the standby, a standby that dies during the
// drain calls the switch-over off (or not, for an engine that cannot resume), and `batonctl
// drain` stops the pair. The suite keeps the ChaosFailover name these tests always had.
#include <gtest/gtest.h>
#include <signal.h>

#include <string>

#include "tests/chaos/chaos_harness.h"
#include "tests/chaos/switchover_support.h"

namespace baton::chaos {
namespace {

TEST(ChaosFailover, GracefulSwitchover) {
  ChaosCluster cluster;
  const json primary = EngineWithRole(cluster.Status(), "primary");
  const json after = SwitchOver(cluster);
  EXPECT_FALSE(ProcessExists(PidOf(primary)));
  EXPECT_EQ(after["crash_loop"]["total_failures"], 0);
  cluster.CheckFencing();
}

// batonctl promote, then SIGKILL of `standby` once the primary drains.
void KillTheStandbyWhileThePrimaryDrains(ChaosCluster& cluster, const json& standby) {
  ASSERT_EQ(cluster.Ctl({"promote"}).exit_code, 0);
  cluster.WaitFor([](const json& s) { return !EngineWithRole(s, "draining").is_null(); },
                  "the primary to drain");
  ASSERT_EQ(::kill(PidOf(standby), SIGKILL), 0);
}

// The standby dies while the primary drains for a switch-over: the switch-over is called
// off and the same primary serves on (same pid, same epoch) instead of being retired with
// no one to take over; a new standby is launched as after any standby failure.
TEST(ChaosFailover, SwitchoverWhoseStandbyDiesIsCalledOff) {
  ClusterOptions options;
  options.engine_args = {"--drain-ms", "60000"};  // the drain outlasts every wait below
  ChaosCluster cluster(options);
  const json before = cluster.Status();
  const json primary = EngineWithRole(before, "primary");
  const json standby = EngineWithRole(before, "standby");
  KillTheStandbyWhileThePrimaryDrains(cluster, standby);
  const json after = cluster.WaitFor(
      [&](const json& s) {
        const json p = EngineWithRole(s, "primary");
        return IsReady(s) && !p.is_null() && p["id"] == primary["id"] &&
               s["controller"]["switchovers_called_off"] == 1;
      },
      "the same primary serving again beside a new standby");
  const json p = EngineWithRole(after, "primary");
  EXPECT_EQ(p["pid"], primary["pid"]);
  EXPECT_EQ(p["epoch"], primary["epoch"]);
  EXPECT_EQ(after["epoch"]["durable"], before["epoch"]["durable"]) << "no fence, no new epoch";
  const json t = cluster.Ctl({"timeline"}).out["timeline"];
  EXPECT_EQ(t["kind"], "switchover");
  EXPECT_NE(t["outcome"].get<std::string>().find("called off"), std::string::npos) << t.dump();
  // The Drained that answers the called-off drain (sent at once on Resume) is not taken as
  // the end of a drain: the primary stays.
  cluster.WaitFor(
      [&](const json&) {
        return cluster.Log().find("answered its called-off drain") != std::string::npos;
      },
      "the called-off drain's answer");
  EXPECT_EQ(PrimaryId(cluster.Status()), primary["id"].get<uint64_t>());
  cluster.CheckFencing();
}

// An engine that does not handle Resume (protocol 2) is never sent one: its switch-over goes
// on, it is retired once drained, and with no standby left a fresh pair is started.
TEST(ChaosFailover, SwitchoverOfAnEngineThatCannotResumeGoesOn) {
  // The drain lasts until the standby has been killed and the controller has said why the
  // switch-over goes on (on a host slow enough for the drain's timeout to come first, the
  // primary is retired by it instead, which this test accepts too).
  const GateFile drain("drain");
  ClusterOptions options;
  options.engine_args = {"--drain-hold-file", drain.path(), "--protocol-2"};
  ChaosCluster cluster(options);
  const json before = cluster.Status();
  const json primary = EngineWithRole(before, "primary");
  const json standby = EngineWithRole(before, "standby");
  KillTheStandbyWhileThePrimaryDrains(cluster, standby);
  cluster.WaitFor(
      [&](const json&) {
        return cluster.Log().find("which cannot call a drain off") != std::string::npos;
      },
      "the switch-over to go on");
  drain.Open();
  const json after = cluster.WaitFor(
      [&](const json& s) { return IsReady(s) && PrimaryId(s) > standby["id"].get<uint64_t>(); },
      "a fresh pair");
  EXPECT_EQ(after["controller"]["switchovers_called_off"], 0);
  EXPECT_FALSE(ProcessExists(PidOf(primary)));
  EXPECT_NE(cluster.Log().find("which cannot call a drain off"), std::string::npos);
  cluster.CheckFencing();
}

TEST(ChaosFailover, DrainStopsThePair) {
  ChaosCluster cluster;
  const json before = cluster.Status();
  ASSERT_EQ(cluster.Ctl({"drain"}).exit_code, 0);
  const json after = cluster.WaitFor(
      [](const json& s) { return s["pair"]["state"] == "stopped" && s["engines"].empty(); },
      "the pair to stop");
  for (const json& e : before["engines"]) EXPECT_FALSE(ProcessExists(PidOf(e)));
  EXPECT_EQ(after["pool"]["free"], after["pool"]["blocks"]);
  const CtlResult refused = cluster.Ctl({"promote"});
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_EQ(refused.out["ok"], false);
}

}  // namespace
}  // namespace baton::chaos
