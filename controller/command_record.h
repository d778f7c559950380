// CommandRecord: the engine command that a promoted upgrade put in place, kept in the state
// directory (<state_dir>/engine_command.json) so that a restarted controller launches the
// upgraded engines rather than the configured ones.
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

struct CommandRecord {
  std::vector<std::string> configured;  // engine.command when the upgrade was promoted
  std::vector<std::string> active;      // what standbys are launched with
  std::vector<std::string> previous;    // what `batonctl rollback` returns to
  bool operator==(const CommandRecord&) const = default;
};

// Written atomically (base/small_file.h).
Status SaveCommandRecord(const std::string& path, const CommandRecord& record);
// nullopt when there is no file; InvalidArgument naming the file when it does not parse.
Result<std::optional<CommandRecord>> LoadCommandRecord(const std::string& path);

}  // namespace baton
