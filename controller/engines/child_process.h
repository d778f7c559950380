// ChildProcess: one engine process held by pidfd, how it is signalled, reaped, adopted and
// let go. Also here: ExitInfo (how it ended), ResolveExecutable (the program exec will run),
// the checks on its process group, and the boot id that tells a roster's pids are this boot's.
//
// ChildProcess owns one child by pidfd: the pid cannot be recycled while the child is
// unreaped, and the pidfd becomes readable the moment the child exits, so death is seen
// within milliseconds (the controller watches it with an Asio stream_descriptor). Signals go
// through pidfd_send_signal and reaping through waitid(P_PIDFD): nothing ever signals or
// reaps a pid that could belong to another process. The destructor of a live, unreaped child
// SIGKILLs and reaps it. Move-only. A spawned child leads its own process group and has no
// parent-death signal: engines outlive the controller, and a restarted controller re-adopts
// them (Adopt).
//
// The methods are in child_process.cc; what makes the process (Spawn, ResolveExecutable and
// ReadStartError) is in child_spawn.cc.
//
// Thread: io_context thread only (fork happens there; the child calls only
// async-signal-safe functions before exec).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "base/io/unique_fd.h"
#include "base/status.h"
#include "controller/engines/spawn_cgroup.h"

namespace baton {

struct ExitInfo {
  int code = 0;    // exit status, when exited normally
  int signal = 0;  // the signal that killed it, else 0
  bool dumped = false;
  bool unknown = false;  // an adopted process (not our child): it exited, nobody told us how
  // Why a spawned child never ran its command ("executing engine command /x: Permission
  // denied"), else empty: it exited 127 between fork and exec.
  std::string start_error;
  // "exited with status 3", "killed by SIGKILL", "could not start: ... (exited with status
  // 127)".
  std::string ToString() const;
};

class ChildProcess {
 public:
  ChildProcess() = default;
  ChildProcess(pid_t pid, UniqueFd pidfd) : pid_(pid), pidfd_(std::move(pidfd)) {}
  ~ChildProcess();
  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&& other) noexcept;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // A process this controller did not start (an engine a previous controller launched, now
  // reparented): pidfd_open(pid), refused with NotFound when it is gone or when its start
  // time (field 22 of /proc/<pid>/stat; 0: not checked) says the pid was reused. It is
  // signalled like a child; TryReap only sees that it exited (poll on the pidfd), not how.
  static Result<ChildProcess> Adopt(pid_t pid, uint64_t start_time);
  // fork + exec `argv` with `env` added to the environment. stdout/stderr go to `log_path`
  // (appended) unless it is empty. With a `cgroup` the child runs in that cgroup from before
  // its exec. Returns once the child exists, without waiting for it to run: on a loaded host
  // a new process may wait hundreds of milliseconds for a CPU, and the caller (the
  // controller's event loop) would wait with it. A child that cannot join its cgroup or exec
  // exits 127, and its ExitInfo says why (`start_error`). Errors: a command not found, no
  // pipe, no fork, a cgroup clone3 refused for another reason than its age.
  static Result<ChildProcess> Spawn(const std::vector<std::string>& argv,
                                    const std::map<std::string, std::string>& env,
                                    const std::string& log_path, SpawnCgroup cgroup = {});

  pid_t pid() const { return pid_; }
  int pidfd() const { return pidfd_.get(); }
  bool reaped() const { return exit_.has_value(); }
  const std::optional<ExitInfo>& exit_info() const { return exit_; }

  // pidfd_send_signal. A child that has exited but is not reaped yet is not an error.
  Status Signal(int sig);
  // Sends `sig` to the child's whole process group (the child leads its own group: an
  // engine's workers and anything a wrapper script started are in it). No member left is
  // not an error.
  Status SignalGroup(int sig);
  // waitid(P_PIDFD, WEXITED | WNOHANG): the exit once the child has exited, else nullopt.
  Result<std::optional<ExitInfo>> TryReap();
  // SIGKILL and a blocking reap (for shutdown and destruction).
  void KillAndReap();
  // Lets the process go without killing it (a controller that hands its engines to the next
  // one): the pidfd is closed, the process runs on.
  void Release();
  bool adopted() const { return adopted_; }

  // Field 22 of /proc/<pid>/stat (clock ticks after boot), 0 when it cannot be read.
  static uint64_t StartTime(pid_t pid);

 private:
  // The ExitInfo::start_error a child wrote to `start_errors_` before it exited, if any.
  std::string ReadStartError();

  pid_t pid_ = 0;
  UniqueFd pidfd_;
  std::optional<ExitInfo> exit_;
  bool adopted_ = false;
  std::string command_;    // the spawned executable, for start_error
  UniqueFd start_errors_;  // a spawned child's exec-error pipe (read end, non-blocking)
};

// An engine command's argv[0] as exec will run it: a path with a '/' that can be executed,
// or the first match on PATH; an error naming it otherwise. (What access() cannot see, a file
// that is no program, the spawned child reports: ExitInfo::start_error.)
Result<std::string> ResolveExecutable(const std::string& name);

// True while process group `pgid` has a member that is not a zombie (a zombie's memory is
// released). Zombies of the group that are the caller's own children are reaped first. Once
// the leader is reaped, this is how a fence knows the engine's other processes are gone too.
bool ProcessGroupAlive(pid_t pgid);
// The pids of process group `pgid`'s members that are not zombies, read from /proc (empty
// when /proc is absent).
std::vector<pid_t> ProcessGroupMembers(pid_t pgid);

// This boot's id (/proc/sys/kernel/random/boot_id): a roster of another boot lists no live
// process. Read once per process.
const std::string& BootId();

}  // namespace baton
