// CommandRecord: the engine command that a promoted upgrade put in place, kept in the state
// directory (<state_dir>/engine_command.json) so that a restarted controller launches the
// upgraded engines rather than the configured ones; and the upgrade in flight, if any, so
// that a controller restarted during one (its engines died with the old one, the canary
// too) records it as rolled back rather than forgetting it.
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

namespace baton {

struct InFlightUpgrade {
  std::string kind;                  // "upgrade" or "rollback"
  std::vector<std::string> command;  // the candidate
  std::string phase;                 // the last phase it reached
  uint64_t canary = 0;               // its engine id (0: not launched yet)
  uint32_t weight = 0;               // the canary's share of new requests, %
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
