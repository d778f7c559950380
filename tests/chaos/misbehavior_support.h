// What the chaos tests of misbehaving peers share: waiting for a refusal in status, checking
// that the primary was left alone, a rogue standby, a report file a rogue engine writes.
// Header-only test support.
#pragma once

#include <signal.h>

#include <filesystem>
#include <string>

#include "tests/chaos/chaos_harness.h"

namespace baton::chaos {

// Status must show a refusal whose reason contains `needle`.
inline json WaitRefusal(const ChaosCluster& cluster, const std::string& needle) {
  return cluster.WaitFor(
      [&](const json& s) {
        for (const json& r : s["history"]["refusals"]) {
          if (r["reason"].get<std::string>().find(needle) != std::string::npos) return true;
        }
        return false;
      },
      "a refusal mentioning '" + needle + "'");
}

inline void ExpectPrimaryUnaffected(const json& before, const json& after) {
  const json p0 = EngineWithRole(before, "primary");
  const json p1 = EngineWithRole(after, "primary");
  ASSERT_FALSE(p1.is_null()) << after.dump(2);
  EXPECT_EQ(p1["pid"], p0["pid"]);
  EXPECT_EQ(p1["epoch"], p0["epoch"]);
  EXPECT_EQ(after["epoch"]["durable"], before["epoch"]["durable"]);
}

// Replaces the standby with one that misbehaves as `mode`.
inline json RogueStandby(ChaosCluster& cluster, const std::string& mode) {
  const json before = cluster.Status();
  cluster.ArmRogue(mode);
  const json standby = EngineWithRole(before, "standby");
  EXPECT_EQ(::kill(PidOf(standby), SIGKILL), 0);
  return before;
}

// The path of the first file in the cluster's directory named `prefix`<anything> (not a
// .tmp), waited for.
inline std::string WaitFileNamed(const ChaosCluster& cluster, const std::string& prefix) {
  std::string found;
  cluster.WaitFor(
      [&](const json&) {
        for (const auto& entry : std::filesystem::directory_iterator(cluster.dir())) {
          const std::string name = entry.path().filename().string();
          if (name.rfind(prefix, 0) == 0 && !name.ends_with(".tmp")) found = entry.path();
        }
        return !found.empty();
      },
      "a file " + prefix + "*");
  return found;
}

}  // namespace baton::chaos
