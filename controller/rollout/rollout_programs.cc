#include "controller/rollout/rollout_programs.h"

#include <array>
#include <climits>
#include <cstdlib>
#include <optional>
#include <string_view>

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

// "the program of [engine] command (PATH)".
std::string EngineProgram(const std::string& engine_program) {
  return "the program of [engine] command" +
         (engine_program.empty() ? std::string() : " (" + engine_program + ")");
}

std::string Listed(const std::vector<std::string>& allowed) {
  if (allowed.empty()) return "empty";
  std::string out;
  for (const std::string& e : allowed) out += (out.empty() ? "\"" : ", \"") + e + "\"";
  return "[" + out + "]";
}

}  // namespace

bool RunsItsArguments(const std::string& program) {
  const std::string_view name = std::string_view(program).substr(program.rfind('/') + 1);
  static constexpr std::array<std::string_view, 24> kExact = {
      "env",    "sh",     "bash",    "dash",  "zsh",     "ksh",     "fish",    "busybox",
      "node",   "nodejs", "nice",    "nohup", "timeout", "taskset", "numactl", "chrt",
      "ionice", "stdbuf", "setpriv", "sudo",  "su",      "runuser", "xargs",   "systemd-run"};
  static constexpr std::array<std::string_view, 5> kPrefix = {"python", "pypy", "perl", "ruby",
                                                              "php"};
  for (std::string_view e : kExact) {
    if (name == e) return true;
  }
  for (std::string_view p : kPrefix) {
    if (name.substr(0, p.size()) == p) return true;
  }
  return false;
}

Status CheckRolloutProgram(const std::string& program, const std::string& engine_program,
                           const std::vector<std::string>& allowed) {
  const std::optional<std::string> real = Canonical(program);
  if (!real.has_value()) {
    return FailedPrecondition("rollout program " + program +
                              " does not resolve to a file on this node");
  }
  for (const std::string& entry : allowed) {
    if (!entry.empty() && Allows(entry, *real)) return OkStatus();
  }
  const bool engines = *real == Canonical(engine_program);
  if (engines && !RunsItsArguments(*real)) return OkStatus();
  const std::string named = *real == program ? program : program + " (" + *real + ")";
  const std::string why =
      engines ? "it is " + EngineProgram(engine_program) +
                    ", but that program runs whatever its arguments name, so a rollout may not "
                    "use it unless listed"
              : "it is not " + EngineProgram(engine_program);
  return FailedPrecondition("rollout program " + named + " is not allowed on this node: " + why +
                            ", and not under " + kRolloutProgramsKey + " (" + Listed(allowed) +
                            "); add it, or its directory with a trailing '/', to " +
                            kRolloutProgramsKey + " in this node's configuration");
}

}  // namespace baton
