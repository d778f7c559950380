// SwitchOver: `batonctl promote` on a ready pair and what every planned switch-over must show,
// for the chaos tests that hand a pair over (the SDK test engine's, the Python engine's, one
// whose logs are checked after it). Header-only test support; the test's main thread.
#pragma once

#include <gtest/gtest.h>

#include "tests/chaos/chaos_harness.h"

namespace baton::chaos {

// Promotes the standby of `cluster`'s ready pair and waits for it to serve with a new
// standby beside it. Checks that the new primary is that standby, that the timeline calls it
// a switch-over and that no failure was counted for it; returns the status after it.
inline json SwitchOver(const ChaosCluster& cluster) {
  const json before = cluster.Status();
  const json primary = EngineWithRole(before, "primary");
  const json standby = EngineWithRole(before, "standby");
  if (primary.is_null() || standby.is_null()) {
    ADD_FAILURE() << "no ready pair to switch over:\n" << before.dump(2);
    return before;
  }
  const CtlResult promote = cluster.Ctl({"promote"});
  EXPECT_EQ(promote.exit_code, 0) << promote.stdout_text;
  const json after = WaitNewPrimary(cluster, primary["id"], "the switch-over");
  EXPECT_EQ(PrimaryId(after), standby["id"].get<uint64_t>());
  EXPECT_EQ(cluster.Ctl({"timeline"}).out["timeline"]["kind"], "switchover");
  EXPECT_EQ(after["crash_loop"]["total_failures"], before["crash_loop"]["total_failures"])
      << "a switch-over is not a failure";
  return after;
}

}  // namespace baton::chaos
