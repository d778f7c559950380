// CommandRecord: the engine command that a promoted upgrade put in place, and the upgrade in
// flight, if any, with its canary policy: what the Coordinator hands to
// Effects::SaveCommandRecord and finds again at a restart (StartState), so that a restarted
// controller launches the upgraded engines rather than the configured ones and resumes an
// upgrade with the engines it re-adopts. The record names the configured command it was made
// against. Its file is written and read by controller/core/command_record.h.
//
// Plain values; any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "controller/core/upgrade_kind.h"

namespace baton {

using EngineIdValue = uint64_t;

struct InFlightUpgrade {
  UpgradeKind kind = UpgradeKind::kUpgrade;
  std::vector<std::string> command;               // the candidate
  UpgradePhase phase = UpgradePhase::kLaunching;  // the last phase it reached
  uint64_t canary = 0;                            // its engine id (0: not launched yet)
  uint32_t weight = 0;                            // the canary's share of new requests, %
  EngineIdValue primary = 0;                      // the primary when it began
  // The canary policy it runs (the configured one with batonctl's overrides); empty steps:
  // not recorded (a record of an older controller), the configured policy applies.
  std::vector<uint32_t> steps = {};
  uint64_t step_duration_ms = 0;
  uint64_t min_requests = 0;
  bool operator==(const InFlightUpgrade&) const = default;
};

struct CommandRecord {
  std::vector<std::string> configured;  // engine.command when the record was written
  std::vector<std::string> active;      // what standbys are launched with
  std::vector<std::string> previous;    // what `batonctl rollback` returns to
  std::optional<InFlightUpgrade> in_flight = std::nullopt;
  // Set by LoadCommandRecord: an `in_flight` entry it could not read, and why (the commands
  // are kept all the same).
  std::string ignored = {};
  bool operator==(const CommandRecord&) const = default;
};

}  // namespace baton
