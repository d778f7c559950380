#include "controller/rollout/rollout_programs.h"

#include <climits>
#include <cstdlib>
#include <optional>

namespace baton {
namespace {

// The canonical path of `path` (realpath); nullopt when it does not resolve.
std::optional<std::string> Canonical(const std::string& path) {
  if (path.empty()) return std::nullopt;
  char buf[PATH_MAX];
  if (::realpath(path.c_str(), buf) == nullptr) return std::nullopt;
  return std::string(buf);
}

// Whether `entry` of rollout_programs allows the canonical `program`.
bool Allows(const std::string& entry, const std::string& program) {
  const std::optional<std::string> where = Canonical(entry);
  if (!where.has_value()) return false;
  if (entry.back() != '/') return *where == program;
  const std::string dir = *where == "/" ? "/" : *where + "/";
  return program.size() > dir.size() && program.compare(0, dir.size(), dir) == 0;
}

std::string Listed(const std::vector<std::string>& allowed) {
  if (allowed.empty()) return "empty";
  std::string out;
  for (const std::string& e : allowed) out += (out.empty() ? "\"" : ", \"") + e + "\"";
  return "[" + out + "]";
}

}  // namespace

Status CheckRolloutProgram(const std::string& program, const std::string& engine_program,
                           const std::vector<std::string>& allowed) {
  const std::optional<std::string> real = Canonical(program);
  if (!real.has_value()) {
    return FailedPrecondition("rollout program " + program +
                              " does not resolve to a file on this node");
  }
  if (*real == Canonical(engine_program)) return OkStatus();
  for (const std::string& entry : allowed) {
    if (!entry.empty() && Allows(entry, *real)) return OkStatus();
  }
  const std::string named = *real == program ? program : program + " (" + *real + ")";
  return FailedPrecondition(
      "rollout program " + named + " is not allowed on this node: it is not the program of " +
      "[engine] command" + (engine_program.empty() ? "" : " (" + engine_program + ")") +
      " and not under " + kRolloutProgramsKey + " (" + Listed(allowed) +
      "); add it, or its directory with a trailing '/', to " + kRolloutProgramsKey +
      " in this node's configuration");
}

}  // namespace baton
