// ChildProcess and Supervisor: how the controller starts engine processes and holds them.
//
// ChildProcess owns one child by pidfd: the pid cannot be recycled while the child is
// unreaped, and the pidfd becomes readable the moment the child exits, so death is seen
// within milliseconds (the controller watches it with an Asio stream_descriptor). Signals go
// through pidfd_send_signal and reaping through waitid(P_PIDFD): nothing ever signals or
// reaps a pid that could belong to another process. The destructor of a live, unreaped child
// SIGKILLs and reaps it. Move-only.
//
// Supervisor expands the configured engine command line ({socket} {token} {role}
// {engine_id} {host} {port} {model_dir} {runtime_dir}), puts the same values in the
// environment (BATON_SOCKET, BATON_LAUNCH_TOKEN, BATON_ENGINE_ID, BATON_ROLE, BATON_HTTP_HOST,
// BATON_HTTP_PORT, BATON_MODEL_DIR, and what SetEngineEnvironment adds), and forks/execs. The child
// leads its own process group and has no parent-death signal: engines outlive the controller, and a
// restarted controller re-adopts them (ChildProcess::Adopt). Its stdout/stderr go to
// <log_dir>/engine-<id>.log when a log directory is configured. Launch tokens are 128 random
// bits from getrandom().
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
#include "proto/roles.h"

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

struct LaunchRequest {
  uint64_t engine_id = 0;
  proto::LaunchRole role = proto::LaunchRole::kStandby;
  std::string token;  // launch token checked in Hello
  int port = 0;
  // The command line to expand instead of the configured one (an upgrade's candidate);
  // empty: the configured command.
  std::vector<std::string> command = {};
  SpawnCgroup cgroup = {};  // the engine's cgroup (EngineCgroup::spawn_target), or none
};

// True while process group `pgid` has a member that is not a zombie (a zombie's memory is
// released). Zombies of the group that are the caller's own children are reaped first. Once
// the leader is reaped, this is how a fence knows the engine's other processes are gone too.
bool ProcessGroupAlive(pid_t pgid);
// The pids of process group `pgid`'s members that are not zombies, read from /proc (empty
// when /proc is absent).
std::vector<pid_t> ProcessGroupMembers(pid_t pgid);

class Supervisor {
 public:
  Supervisor(std::vector<std::string> command, std::string socket_path, std::string model_dir,
             std::string runtime_dir, std::string log_dir);

  Result<ChildProcess> Launch(const LaunchRequest& request) const;
  // More variables for every engine's environment (the absent-controller policy).
  void SetEngineEnvironment(std::map<std::string, std::string> env) { extra_env_ = std::move(env); }
  // The address engines listen on and announce ({host}, engine.host).
  void SetHost(std::string host) { host_ = std::move(host); }

  // The command line `Launch` would run.
  std::vector<std::string> Expand(const LaunchRequest& request) const;
  // Whether `command` (empty: the configured one) could be launched: its program, with the
  // placeholders expanded and resolved against PATH as Launch resolves it, is an executable
  // file. FailedPrecondition naming the program and why not.
  Status CheckCommand(const std::vector<std::string>& command) const;

  // 32 hex digits from getrandom().
  static Result<std::string> NewToken();

 private:
  std::map<std::string, std::string> Placeholders(const LaunchRequest& request) const;

  std::vector<std::string> command_;
  std::string socket_path_;
  std::string model_dir_;
  std::string runtime_dir_;
  std::string log_dir_;
  std::string host_ = "127.0.0.1";
  std::map<std::string, std::string> extra_env_;
};

// This boot's id (/proc/sys/kernel/random/boot_id): a roster of another boot lists no live
// process. Read once per process.
const std::string& BootId();

// Replaces each {name} in `text` by values.at(name); unknown {names} are kept as they are.
std::string ExpandPlaceholders(const std::string& text,
                               const std::map<std::string, std::string>& values);

}  // namespace baton
