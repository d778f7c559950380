// Upgrade: one engine-version upgrade (or rollback) in flight, run by the controller as a
// lossless canary.
//
// Phases, in order:
//   launching   the standby was retired; the candidate command starts as the new standby
//   reclaiming  the candidate is a ready standby; the primary is asked (Reclaim) to return
//               free blocks for the canary's first step
//   promoting   the candidate is promoted at its own epoch with those blocks: the canary
//   canary      it serves steps[i] % of new requests; the CanaryJudge advances, promotes or
//               rolls it back on what the routers saw
//   finishing   the last step passed: the old primary drains; the canary takes over as
//               primary once it is drained (no promotion: it already serves)
//   rolling_back  the canary drains; its requests finish, the primary gets its blocks back
//               and a standby of the previous command is launched
// A canary that fails at any phase ends the upgrade as rolled back. A primary that fails
// during the upgrade hands the service to the canary (serving) or to the failover (which
// promotes the candidate standby): the upgrade ends as promoted.
//
// Plain value owned by the Coordinator's UpgradePart; the Coordinator's thread.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/clock.h"
#include "controller/core/canary.h"
#include "controller/core/pool_ledger.h"
#include "controller/core/upgrade_kind.h"

namespace baton {

struct Upgrade {
  using Phase = UpgradePhase;  // controller/upgrade/upgrade_kind.h

  UpgradeKind kind = UpgradeKind::kUpgrade;
  std::vector<std::string> command;   // the candidate engine command
  std::vector<std::string> previous;  // the command the pair ran before
  CanaryPolicy policy;
  Phase phase = Phase::kLaunching;
  EngineId primary = kNoEngine;  // the primary when it began
  EngineId canary = kNoEngine;   // the candidate's engine, once launched
  TimePoint started{};
  TimePoint phase_since{};
  std::optional<TimePoint> deadline;  // reclaiming: promote with what is free by then
  TimePoint next_reclaim{};           // canary: when to ask the primary for blocks again
  std::optional<CanaryJudge> judge;   // from the canary phase on
  std::string judgement;              // the judge's last word, for status
  std::string rollback_reason;
};

// The end of an upgrade, kept for `batonctl status`.
struct UpgradeResult {
  UpgradeKind kind = UpgradeKind::kUpgrade;
  UpgradeOutcome outcome = UpgradeOutcome::kPromoted;
  std::string reason;
  EngineId canary = kNoEngine;
  std::string version;  // what the canary reported at Register
  uint32_t last_weight = 0;
  TimePoint started{};
  TimePoint ended{};
};

// What `batonctl upgrade` asks for: the candidate command, and overrides of [upgrade].
struct UpgradeRequest {
  std::vector<std::string> command = {};
  std::optional<std::vector<uint32_t>> steps = {};
  std::optional<Duration> step_duration = {};
  std::optional<uint64_t> min_requests = {};
};

// A command line as one string, its arguments separated by spaces (for logs).
std::string Joined(const std::vector<std::string>& args);
// How many ended upgrades `batonctl status` keeps.
inline constexpr size_t kKeepUpgrades = 10;

}  // namespace baton
