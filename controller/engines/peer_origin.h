// Which engine a local process belongs to, told from /proc when it connects to the controller
// (Controller::Admit): an engine's launch token is taken only from a process of that engine,
// and no process of an engine may speak to the controller as batonctl or as a router, so that
// code running inside an engine cannot promote, drain, upgrade or read the route table.
//
// A process belongs to an engine when one of these holds, each read at the time of the call:
//   - the engine has a cgroup, and the process's cgroup v2 directory is it or one below it;
//   - the process is in the engine's process group (an engine leads its own: pgid = pid);
//   - the process is the engine's process or one of its descendants.
// A process that is gone, or whose /proc entry cannot be read, belongs to none; so the
// controller also asks ConnectedProcessGone (base/process/proc_table.h) after EngineOwning, and
// serves no Hello whose connecting process is gone (a process of an engine could otherwise connect
// in a child that exits at once, then speak over the connection itself).
//
// What this is not: a sandbox. A process of the same user that leaves its engine's cgroup
// (the cgroup directories belong to that user), its process group and its parent is no longer
// told apart; docs/operations.md (Users and ports) says what protects what.
//
// Plain functions reading /proc; thread-compatible.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>

namespace baton {

// An engine's processes as the controller knows them.
struct EngineProcesses {
  uint64_t id = 0;
  pid_t leader = 0;    // the process the controller launched or adopted: its group's id
  std::string cgroup;  // its cgroup v2 directory, "" without one
};

// The engine (of `engines`) that process `pid` belongs to, with the rule that placed it there
// ("cgroup", "process group" or "descendant") in `*rule` when not null; nullopt for none.
std::optional<uint64_t> EngineOwning(pid_t pid, std::span<const EngineProcesses> engines,
                                     std::string* rule = nullptr);

}  // namespace baton
