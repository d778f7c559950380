// Helpers of the controller-restart chaos tests (controller_restart_test.cc,
// controller_restart_proof_test.cc): what a restarted controller's status says of the pair it
// re-adopted. Header-only test support.
#pragma once

#include <gtest/gtest.h>

#include <set>

#include "tests/chaos/chaos_harness.h"

namespace baton::chaos {

inline std::set<pid_t> EnginePids(const json& status) {
  std::set<pid_t> pids;
  for (const json& e : status["engines"]) pids.insert(PidOf(e));
  return pids;
}

// The same primary and standby as `before` (ids and pids), ready again.
inline bool SamePair(const json& before, const json& s) {
  return IsReady(s) && PrimaryId(s) == PrimaryId(before) &&
         EngineWithRole(s, "standby")["id"] == EngineWithRole(before, "standby")["id"] &&
         EnginePids(s) == EnginePids(before);
}

inline void ExpectAdoptedMemory(const json& s) {
  EXPECT_EQ(s["weights"]["load_method"], "adopted") << s["weights"].dump();
  EXPECT_EQ(s["weights"]["bytes_read"], 0) << "not a byte of the model files read again";
  EXPECT_TRUE(s["pool"]["adopted"].get<bool>()) << s["pool"].dump();
  EXPECT_EQ(s["controller"]["recovery"]["memory"], "adopted") << s["controller"].dump();
}

inline void ExpectHealthy(const ChaosCluster& cluster, const json& s) {
  EXPECT_EQ(s["invariants"], "ok") << s.dump();
  EXPECT_EQ(s["controller"]["refused_transitions"], 0) << s["controller"].dump();
  cluster.CheckFencing();
}

}  // namespace baton::chaos
