// Canary upgrades of a pair of reference engines, as the upgrade tests drive them through
// batonctl: shared by tests/chaos/upgrade_test.cc and the emulated-device tests.
// Header-only test support; used from the test's main thread.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "tests/chaos/chaos_harness.h"
#include "tests/chaos/router_stream_support.h"

namespace baton::chaos {

// batonctl upgrade with short steps: the tiny model answers in milliseconds.
inline std::vector<std::string> UpgradeArgs(const std::vector<std::string>& extra) {
  std::vector<std::string> args = {"upgrade", "--steps",        "50,100", "--step-ms",
                                   "300",     "--min-requests", "5",      "--"};
  std::vector<std::string> command = RefenginePair().engine_command;
  args.insert(args.end(), command.begin(), command.end());
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// Waits until the upgrade in flight has ended; returns its result.
inline json WaitUpgradeEnded(const ChaosCluster& cluster, size_t ended_before) {
  const json s = cluster.WaitFor(
      [&](const json& st) { return st["upgrade"]["history"].size() > ended_before; },
      "the upgrade ended", std::chrono::seconds(60));
  return s["upgrade"]["history"].empty() ? json() : s["upgrade"]["history"].back();
}

// `batonctl upgrade` (UpgradeArgs with `extra`), then waits until it has ended and the pair
// is ready again; returns how it ended.
inline json UpgradeToTheEnd(const ChaosCluster& cluster, const std::vector<std::string>& extra) {
  const CtlResult up = cluster.Ctl(UpgradeArgs(extra));
  EXPECT_EQ(up.exit_code, 0) << up.stdout_text;
  if (up.exit_code != 0) return json();
  const json ended = WaitUpgradeEnded(cluster, 0);
  cluster.WaitReady("the pair after the upgrade");
  return ended;
}

// `batonctl upgrade` to the reference engine as "refengine-v2" with steps too long to pass,
// so the canary stays at 50 %; returns the status once the canary serves.
inline json StartACanaryThatStays(const ChaosCluster& cluster) {
  std::vector<std::string> args = UpgradeArgs({"--engine-version", "refengine-v2"});
  args[4] = "60000";  // --step-ms
  const CtlResult up = cluster.Ctl(args);
  EXPECT_EQ(up.exit_code, 0) << up.stdout_text;
  return cluster.WaitFor(
      [](const json& st) {
        return !st["upgrade"]["current"].is_null() && st["upgrade"]["current"]["phase"] == "canary";
      },
      "the canary serves");
}

// `batonctl upgrade` to the engines' own command (a canary that changes nothing) with `steps` too
// long to pass; returns the status once the canary serves with `blocks`.
inline json CanaryOfTheSameCommand(const ChaosCluster& cluster, const std::string& steps = "50,100",
                                   int blocks = 8) {
  const json before = cluster.Status();
  std::vector<std::string> args = {"upgrade", "--steps", steps, "--step-ms", "600000", "--"};
  for (const json& part : before["upgrade"]["active_command"]) {
    args.push_back(part.get<std::string>());
  }
  const CtlResult up = cluster.Ctl(args);
  EXPECT_EQ(up.exit_code, 0) << up.stdout_text;
  return cluster.WaitFor(
      [&](const json& st) {
        return !st["upgrade"]["current"].is_null() &&
               st["upgrade"]["current"]["phase"] == "canary" &&
               EngineWithRole(st, "canary")["blocks"] == blocks;
      },
      "the canary serves with " + std::to_string(blocks) + " blocks", std::chrono::seconds(30));
}

}  // namespace baton::chaos
