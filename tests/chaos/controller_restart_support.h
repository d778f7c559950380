// Helpers of the controller-restart chaos tests (controller_restart_test.cc,
// controller_restart_proof_test.cc): what a restarted controller's status says of the pair it
// re-adopted. Header-only test support.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <string>

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

// Both roster slots written over with JSON that does not parse: nothing the previous
// controller ran can be accounted for.
inline void CorruptBothRosterSlots(const ChaosCluster& cluster) {
  for (const char* slot : {"/run/state/roster.json", "/run/state/roster.1.json"}) {
    std::ofstream(cluster.dir() + slot) << "{\"format\": 1, \"engines\": [tr";
  }
}

// A new pair once the previous controller's two engines are fenced at the restart; none of
// them (`before`'s) is in it. The weights were not adopted, and the memory's reason holds
// `why`.
inline json ExpectMemoryRefusedAndEnginesFenced(const ChaosCluster& cluster, const json& before,
                                                const std::string& why) {
  const json after = cluster.WaitFor(
      [&](const json& s) {
        return IsReady(s) && s["controller"]["recovery"]["fenced"].size() == 2;
      },
      "a new pair, the old engines fenced");
  EXPECT_NE(after["weights"]["load_method"], "adopted");
  EXPECT_NE(after["controller"]["recovery"]["memory"].get<std::string>().find(why),
            std::string::npos)
      << after["controller"].dump();
  for (pid_t pid : EnginePids(before)) EXPECT_EQ(EnginePids(after).count(pid), 0u);
  return after;
}

inline void ExpectHealthy(const ChaosCluster& cluster, const json& s) {
  EXPECT_EQ(s["invariants"], "ok") << s.dump();
  EXPECT_EQ(s["controller"]["refused_transitions"], 0) << s["controller"].dump();
  cluster.CheckFencing();
}

}  // namespace baton::chaos
