// A canary upgrade of a real pair of reference engines meeting two faults at once: the
// primary and the canary killed with kill -9 together. The canary, dying too, must not take
// over (that would switch the engines' command to one never judged): the upgrade is rolled
// back and the pair comes back on the command it ran.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <thread>

#include "base/process/proc_table.h"
#include "tests/chaos/chaos_harness.h"
#include "tests/chaos/upgrade_support.h"

namespace baton::chaos {
namespace {

using std::chrono::milliseconds;

// Waits (up to 5 s) until `pid` is a zombie or gone.
bool AwaitDeath(pid_t pid) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < until) {
    const std::optional<ProcStat> st = ReadProcStat(pid);
    if (!st.has_value() || st->state == 'Z') return true;
    std::this_thread::sleep_for(milliseconds(2));
  }
  return false;
}

// Both deaths are made to wait for the controller together: it is stopped (SIGSTOP) while the
// two engines are killed and have died, then continued, so that whichever death it handles
// first, the other is there to be seen.
TEST(UpgradeDoubleFaultTest, ACanaryKilledWithThePrimaryIsNotPromoted) {
  ChaosCluster cluster(RefenginePair());
  const json s = StartACanaryThatStays(cluster);
  const json primary = EngineWithRole(s, "primary");
  const json canary = EngineWithRole(s, "canary");
  ASSERT_FALSE(primary.is_null() || canary.is_null()) << s.dump();
  const pid_t controller = cluster.controller_pid();
  ASSERT_EQ(::kill(controller, SIGSTOP), 0);
  EXPECT_EQ(::kill(PidOf(primary), SIGKILL), 0);
  EXPECT_EQ(::kill(PidOf(canary), SIGKILL), 0);
  const bool dead = AwaitDeath(PidOf(primary)) && AwaitDeath(PidOf(canary));
  ASSERT_EQ(::kill(controller, SIGCONT), 0);
  ASSERT_TRUE(dead) << "the engines did not die within 5 s of SIGKILL";
  const json ended = WaitUpgradeEnded(cluster, 0);
  EXPECT_EQ(ended["outcome"], "rolled_back") << ended.dump();
  cluster.WaitReady("the pair after the rollback");
  const json after = cluster.Status();
  EXPECT_EQ(EngineWithRole(after, "primary")["version"], "baton-refengine") << after.dump();
  EXPECT_EQ(after["upgrade"]["promoted"], 0) << after.dump();
  cluster.CheckFencing();
}

}  // namespace
}  // namespace baton::chaos
