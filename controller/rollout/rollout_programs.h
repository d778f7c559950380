// Rollout programs: which programs a fleet-wide upgrade may make this node run (docs/fleet.md,
// Security). Whoever can write <prefix>rollout in etcd chooses a rollout's command; the node's
// own configuration decides which programs that command may start:
//   * the program of the node's configured engine command ([engine] command), unless it runs
//     whatever its arguments name (RunsItsArguments: env, a shell, an interpreter, a wrapper
//     such as nice or taskset: allowing it would allow anything); a rollout of another
//     version at the same path (after realpath) needs no list;
//   * each entry of [fleet] rollout_programs: one ending in '/' allows every program under that
//     directory, at any depth; any other allows that one program.
// Paths are compared canonical (realpath: symlinks resolved, "." and ".." gone), so a program
// named through a symlink or "dir/../" is judged where it really is. An entry or a program that
// does not resolve matches nothing. A local `batonctl upgrade` (the operator on the node,
// through the control socket) is not checked.
//
// Plain functions (they read the file system); thread-compatible.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"

namespace baton {

// Whether `program` (a path; its file name is what counts: "python3.11", "env", "dash") is
// a launcher, a shell or an interpreter, which runs a program or a script its arguments name.
bool RunsItsArguments(const std::string& program);

// The [fleet] key that lists the programs.
inline constexpr const char* kRolloutProgramsKey = "fleet.rollout_programs";

// OK when `program` (the path launch would exec: placeholders expanded, PATH searched) may be
// run by a rollout on a node whose engine command's program is `engine_program` (resolved the
// same way; empty when it does not resolve) and whose [fleet] rollout_programs is `allowed`.
// FailedPrecondition naming the program and the key to set otherwise.
Status CheckRolloutProgram(const std::string& program, const std::string& engine_program,
                           const std::vector<std::string>& allowed);

}  // namespace baton
