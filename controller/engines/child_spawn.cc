// ChildProcess::Spawn, declared in child_process.h: an engine's process made, in its cgroup,
// without waiting for it to run. Also ResolveExecutable, and reading the error of a child that
// could not start. Between the fork and the exec the child makes async-signal-safe calls only:
// everything it needs is made before the fork.
#include <fcntl.h>
#include <linux/sched.h>
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <utility>

#include "base/io/private_dir.h"
#include "base/log.h"
#include "base/process/close_fds.h"
#include "base/process/pidfd.h"
#include "controller/engines/child_process.h"

extern char** environ;

namespace baton {
namespace {

std::vector<std::string> BuildEnv(const std::map<std::string, std::string>& extra) {
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string entry = *e;
    const std::string key = entry.substr(0, entry.find('='));
    if (extra.count(key) == 0) env.push_back(std::move(entry));
  }
  for (const auto& [k, v] : extra) env.push_back(k + "=" + v);
  return env;
}

std::vector<char*> CStrings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// In the child: the engine inherits stdin, stdout and stderr only. Every other descriptor
// of the controller (its listening socket, other engines' and batonctl's connections, the
// metrics server) is marked close-on-exec, so that a live engine cannot keep a peer's
// connection open after the controller closed it. `keep` is the exec-error pipe, which is
// close-on-exec already. Async-signal-safe.
void CloseInheritedFds(int keep) { SweepFdsFrom(3, FdSweep::kCloseOnExec, keep); }

// What the child reports on the exec-error pipe when it cannot run the engine.
struct ChildError {
  int stage;  // kJoinCgroup or kExec
  int err;    // errno
};
constexpr int kJoinCgroup = 1;
constexpr int kExec = 2;

[[noreturn]] void ChildFails(int error_fd, int stage) {
  const ChildError e{.stage = stage, .err = errno};
  ssize_t unused = ::write(error_fd, &e, sizeof(e));
  (void)unused;
  ::_exit(127);
}

// In the child, between fork and exec: async-signal-safe calls only.
[[noreturn]] void ExecChild(const char* path, char** argv, char** envp, int log_fd, int error_fd,
                            int cgroup_fd) {
  // No parent-death signal: an engine outlives its controller and is re-adopted by the next.
  if (cgroup_fd >= 0 && ::write(cgroup_fd, "0", 1) != 1) ChildFails(error_fd, kJoinCgroup);
  // A process group of its own, in the controller's session: terminal signals go to the
  // controller only. Not a session of its own: the kernel schedules each session apart
  // (autogroups), and engines that compute would take the controller's share of the CPU.
  // (So the controller's death orphans the group, and the kernel ends a stopped engine with
  // SIGHUP: the next controller would have fenced it.)
  ::setpgid(0, 0);
  // Signals arrive blocked (Spawn): every handler back to the default before they are let
  // in, so none of the controller's handlers runs here; SIGPIPE, ignored by the controller,
  // too.
  for (int sig = 1; sig < NSIG; ++sig) {
    struct sigaction action {};
    if (::sigaction(sig, nullptr, &action) == 0 && action.sa_handler != SIG_DFL &&
        (action.sa_handler != SIG_IGN || sig == SIGPIPE)) {
      ::signal(sig, SIG_DFL);
    }
  }
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  if (log_fd >= 0) {
    ::dup2(log_fd, STDOUT_FILENO);
    ::dup2(log_fd, STDERR_FILENO);
  }
  CloseInheritedFds(error_fd);
  ::execve(path, argv, envp);
  ChildFails(error_fd, kExec);
}

// clone3 with CLONE_INTO_CGROUP (SpawnCgroup): a fork whose child starts in the cgroup of
// `dir_fd`. Returns the pid, 0 in the child, or -1 with errno.
pid_t CloneIntoCgroup(int dir_fd) {
  clone_args args{};
  args.flags = CLONE_INTO_CGROUP;
  args.exit_signal = SIGCHLD;
  args.cgroup = static_cast<uint64_t>(dir_fd);
  return static_cast<pid_t>(::syscall(SYS_clone3, &args, sizeof(args)));
}

// What clone3 answers on a kernel before 5.7: no clone3 (ENOSYS), or one that does not know
// CLONE_INTO_CGROUP or the `cgroup` field (EINVAL, E2BIG).
bool KernelLacksCloneIntoCgroup(int err) { return err == ENOSYS || err == EINVAL || err == E2BIG; }

// Set once clone3 was refused (a kernel before 5.7, a seccomp profile): later spawns fork
// and migrate at once, and the log says so once.
std::atomic<bool> clone3_refused{false};

void NoteClone3Refused(int err) {
  if (clone3_refused.exchange(true)) return;
  BATON_LOG(WARN, "supervisor") << "engines join their cgroups through cgroup.procs: clone3 with "
                                   "CLONE_INTO_CGROUP refused ("
                                << std::strerror(err)
                                << "; a kernel before 5.7 or a seccomp profile such as systemd's "
                                   "RestrictNamespaces)";
}

// Forks, the child in `cgroup` (made there, or migrated by ExecChild when `*join_fd` is left
// >= 0). Returns the pid, 0 in the child.
Result<pid_t> ForkChild(SpawnCgroup cgroup, int* join_fd) {
  *join_fd = -1;
  if (cgroup.dir_fd >= 0 && !clone3_refused.load(std::memory_order_relaxed)) {
    const pid_t pid = CloneIntoCgroup(cgroup.dir_fd);
    if (pid >= 0) return pid;
    const int err = errno;
    if (!KernelLacksCloneIntoCgroup(err)) return ErrnoStatus("joining the engine's cgroup", err);
    NoteClone3Refused(err);
  }
  if (cgroup.dir_fd >= 0 && cgroup.procs_fd < 0) {
    return ErrnoStatus("joining the engine's cgroup without clone3 or its cgroup.procs", ENOSYS);
  }
  *join_fd = cgroup.procs_fd;
  const pid_t pid = ::fork();
  if (pid < 0) return ErrnoStatus("fork", errno);
  return pid;
}

}  // namespace

Result<std::string> ResolveExecutable(const std::string& name) {
  if (name.find('/') != std::string::npos) {
    if (::access(name.c_str(), X_OK) == 0) return name;
    return ErrnoStatus("engine program " + name, errno);
  }
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::string candidate = dirs.substr(start, end - start) + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return NotFound("engine command '" + name + "' is not on PATH");
}

Result<ChildProcess> ChildProcess::Spawn(const std::vector<std::string>& argv,
                                         const std::map<std::string, std::string>& env,
                                         const std::string& log_path, SpawnCgroup cgroup) {
  if (argv.empty()) return InvalidArgument("empty engine command");
  BATON_ASSIGN_OR_RETURN(std::string path, ResolveExecutable(argv[0]));
  std::vector<std::string> args = argv;
  std::vector<std::string> envs = BuildEnv(env);
  std::vector<char*> c_args = CStrings(args);
  std::vector<char*> c_envs = CStrings(envs);
  UniqueFd log_fd;
  if (!log_path.empty()) {
    log_fd =
        UniqueFd(::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | kPrivateFileFlags, 0644));
    if (!log_fd) return PrivateFileOpenError("opening engine log", log_path, errno);
  }
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK) != 0) return ErrnoStatus("pipe2", errno);
  UniqueFd error_read(pipe_fds[0]);
  UniqueFd error_write(pipe_fds[1]);
  int join_fd = -1;
  sigset_t all;
  sigset_t before;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &before);
  Result<pid_t> forked = ForkChild(cgroup, &join_fd);
  if (forked.ok() && *forked == 0) {
    ExecChild(path.c_str(), c_args.data(), c_envs.data(), log_fd.get(), error_write.get(), join_fd);
  }
  ::pthread_sigmask(SIG_SETMASK, &before, nullptr);
  BATON_ASSIGN_OR_RETURN(const pid_t pid, forked);
  error_write.Reset();
  // The child leads its own group before this returns, whether it ran or not (the child
  // does the same: whichever runs first; once it has exec'd, this one is refused, harmlessly).
  (void)::setpgid(pid, pid);
  UniqueFd pidfd(PidfdOpen(pid));
  const int open_errno = errno;
  ChildProcess child(pid, std::move(pidfd));
  if (!child.pidfd_) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    child.pid_ = 0;
    return ErrnoStatus("pidfd_open", open_errno);
  }
  child.command_ = path;
  child.start_errors_ = std::move(error_read);
  return child;
}

std::string ChildProcess::ReadStartError() {
  if (!start_errors_) return "";
  ChildError failed{};
  ssize_t n;
  do {
    n = ::read(start_errors_.get(), &failed, sizeof(failed));
  } while (n < 0 && errno == EINTR);
  start_errors_.Reset();
  if (n != sizeof(failed)) return "";
  const std::string what = failed.stage == kJoinCgroup ? "joining the engine's cgroup"
                                                       : "executing engine command " + command_;
  return what + ": " + std::strerror(failed.err);
}

}  // namespace baton
