// What /proc says of the processes of this machine, for the programs that must find every
// process a run started (RunGuard, the test suite's last check) and the benchmarks' check for
// stale Baton processes before they measure anything.
//
// A process is found by a tag in its environment: a variable whose value is a list of tokens
// separated by ':' (a run nested in another one appends its own token), as it was when the
// process was started (/proc/PID/environ); every process a run starts inherits it, whatever
// its parent, session or process group became. A process whose environment cannot be read
// (gone, a zombie, another user's) carries no tag. Plain functions; thread-compatible.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace baton {

// Every pid in /proc, in no particular order.
std::vector<pid_t> ListPids();

// The value of `name` in the environment `pid` was started with; nullopt when it is not
// there or cannot be read.
std::optional<std::string> StartEnvironValue(pid_t pid, std::string_view name);

// True when `token` is one of the ':'-separated tokens of `list`.
bool HasToken(std::string_view list, std::string_view token);

// The processes whose start environment has `token` in variable `name`, except `exclude`.
std::vector<pid_t> TaggedProcesses(std::string_view name, std::string_view token,
                                   const std::vector<pid_t>& exclude);

// What /proc/PID/stat says of a process: its parent, its process group, its state ('Z': a
// zombie) and when it started (clock ticks after boot). Nullopt when it is gone.
struct ProcStat {
  pid_t ppid = 0;
  pid_t pgid = 0;
  char state = 0;
  uint64_t start_ticks = 0;
};
std::optional<ProcStat> ReadProcStat(pid_t pid);

// `pid`'s parent, its parent's parent, ... up to (and without) pid 0.
std::vector<pid_t> Ancestors(pid_t pid);

// /proc/PID/comm without its newline ("" when gone).
std::string ProcessName(pid_t pid);
// /proc/PID/cmdline with its arguments separated by spaces ("" when gone or a zombie).
std::string ProcessCommandLine(pid_t pid);
// True while a process with this pid exists, a zombie included.
bool ProcessPresent(pid_t pid);
// True while `pid` runs: it exists and is neither a zombie nor dead (an orphan's zombie may
// wait long for its reaper).
bool ProcessRunning(pid_t pid);
// The program `pid` runs: /proc/PID/exe, without the " (deleted)" the kernel appends once the
// file was replaced (an install over a running program); "" when gone or not readable (another
// user's process).
std::string ProcessProgram(pid_t pid);

// True when the process that connected to a socket is gone: `pid` (its SO_PEERCRED) is not
// positive, or names no running process (a zombie included), or `pidfd` (its SO_PEERPIDFD, -1
// without one) says it exited: then what /proc says of `pid` may be another process's. Asked
// after reading /proc of `pid`, a false answer vouches that what was read was the connector's.
bool ConnectedProcessGone(pid_t pid, int pidfd);

}  // namespace baton
