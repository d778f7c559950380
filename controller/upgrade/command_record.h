// CommandRecord: the engine command that a promoted upgrade put in place, kept in the state
// directory (<state_dir>/engine_command.json) so that a restarted controller launches the
// upgraded engines rather than the configured ones; and the upgrade in flight, if any, with
// its canary policy, so that a controller restarted during one resumes it with the engines
// it re-adopts (or records it as rolled back when they are gone) rather than forgetting it.
//
// The record names the configured command it was made against. LoadCommandRecord() returns
// it only while engine.command is still that one: an operator who changed the config since
// wins, and the record is set aside (the caller logs it). A record that does not parse is
// an error for the caller to log; it never stops the controller. Plain functions.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "controller/upgrade/upgrade_kind.h"

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

// Whether `command` can be kept in the record byte for byte: JSON holds UTF-8 text only.
// InvalidArgument naming `what`, the word and the byte otherwise. Commands are checked where
// they come in (the configuration, batonctl upgrade), so that saving never meets one.
Status CheckRecordableCommand(const std::vector<std::string>& command, const std::string& what);

// Written atomically (base/io/small_file.h). A command that is not UTF-8 is refused with
// InvalidArgument, nothing written.
Status SaveCommandRecord(const std::string& path, const CommandRecord& record);
// nullopt when there is no file; InvalidArgument naming the file when its commands do not
// parse.
Result<std::optional<CommandRecord>> LoadCommandRecord(const std::string& path);

}  // namespace baton
