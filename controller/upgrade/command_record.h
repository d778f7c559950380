// The file of a CommandRecord (controller/core/command_record.h), in the state directory
// (<state_dir>/engine_command.json): the engine command that a promoted upgrade put in place,
// so that a restarted controller launches the upgraded engines rather than the configured
// ones; and the upgrade in flight, if any, with its canary policy, so that a controller
// restarted during one resumes it with the engines it re-adopts (or records it as rolled back
// when they are gone) rather than forgetting it.
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
#include "controller/core/command_record.h"

namespace baton {

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
