// RunGuard: nothing a benchmark or a test started outlives it, however it ends.
//
// Install(), at the top of main while the process has one thread, gives the run a fresh
// token, appends it to BATON_RUN_GUARD in the process's own environment (proc_table.h: every
// process it starts inherits it: engines, routers, etcd, and baton-keeper, which a controller
// starts detached on purpose so that it outlives the controller) and forks a reaper. The
// reaper holds the read end of a pipe whose write end only this process holds
// (close-on-exec). When the pipe closes, the reaper stops (SIGSTOP, so that none reacts to
// another's death) and kills (SIGKILL) every process that carries the token, again until
// three scans in a row find none, then waits until each is gone (reaped by its
// parent) and until init has reaped the orphaned zombies younger than the run (a keeper that
// exited by itself still shows in `pgrep` until then), at most kSweepLimit in all. The pipe
// closes
//   * when the run returns from main or calls exit(): an atexit handler closes it and waits
//     for the reaper, reaping this process's own children meanwhile;
//   * on SIGINT, SIGTERM or SIGHUP (Ctrl-C sends SIGINT to the whole process group): handlers
//     do the same, then let the signal end the process as it would have;
//   * when the process is killed (kill -9, the OOM killer, a test runner's timeout): the
//     kernel closes it, and the reaper sweeps after the fact.
// Before it kills, the reaper sends SIGTERM to the run's controllers and waits up to
// kGentleLimit for them to end: a controller that stops cleanly stops its engines and removes
// their cgroups, which a SIGKILL would leave behind. Folders the run registered with
// RemoveIfInterrupted are removed after the sweep unless the run ended by returning or
// exit() (whose own code removes them, or keeps them on purpose).
// The reaper leaves the process group and ignores the terminal's signals, so the Ctrl-C that
// stops the run does not stop it. A signal handler the program set itself is left alone.
//
// One per process (a forked child of a guarded process may install its own, nested). Thread:
// Install() from main before any thread starts; the exit and signal paths are async-signal-safe up
// to the reaper's end.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <string_view>

#include "base/status.h"

namespace baton {

inline constexpr const char* kRunGuardVariable = "BATON_RUN_GUARD";

class RunGuard {
 public:
  static constexpr std::chrono::seconds kSweepLimit{20};
  static constexpr std::chrono::seconds kGentleLimit{5};

  // Tags the environment and starts the reaper; `name` (the program's) prefixes the token and
  // the reaper's report. Refused when a guard is installed already or the reaper cannot start.
  static Status Install(std::string_view name);
  // The run's token ("" before Install).
  static const std::string& token();
  // The reaper's pid (0 before Install): a fork of this process, without the token.
  static pid_t reaper();
  // Sweeps now: closes the pipe, waits for the reaper; nothing tagged is left afterwards.
  // The atexit and signal paths call it; later calls do nothing.
  static void Finish();
  // `path` (a scratch folder the run removes at its end) is removed by the reaper if the run
  // is interrupted: a signal, or killed. Nothing without a guard.
  static void RemoveIfInterrupted(const std::string& path);
  // `hook(sig)` runs in the signal path after the sweep, before the signal ends the process:
  // an async-signal-safe last word (a perf driver's JSON line). Set from main, after Install.
  static void SetSignalHook(void (*hook)(int sig));
};

// Kills every process whose start environment has `token` in BATON_RUN_GUARD (but the caller)
// until none is left, then waits until each killed one is gone, at most `limit`. Returns how
// many it killed; `names` gets "pid name" of each (best effort). The reaper's sweep; also for
// tests.
int KillTaggedProcesses(std::string_view token, std::chrono::milliseconds limit,
                        std::string* names = nullptr);

}  // namespace baton
