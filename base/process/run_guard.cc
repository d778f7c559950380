#include "base/process/run_guard.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <thread>
#include <vector>

#include "base/process/close_fds.h"
#include "base/process/proc_table.h"

namespace baton {
namespace {

// The guard's state: written once by Install() before any thread, read by the exit paths.
struct GuardState {
  std::string token;
  std::string name;
  pid_t owner = 0;
  pid_t reaper = 0;
  int write_fd = -1;
  uint64_t started_ticks = 0;  // the run's start (/proc/PID/stat)
};
GuardState& State() {
  static GuardState* state = new GuardState();  // never destroyed: the exit paths read it
  return *state;
}
volatile sig_atomic_t g_finishing = 0;
void (*g_signal_hook)(int) = nullptr;  // SetSignalHook's
const int kSignals[] = {SIGINT, SIGTERM, SIGHUP};

std::string NewToken(std::string_view name) {
  uint32_t random = 0;
  if (::getrandom(&random, sizeof(random), GRND_NONBLOCK) != sizeof(random)) {
    random = static_cast<uint32_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  }
  char suffix[16];
  std::snprintf(suffix, sizeof(suffix), "%08x", random);
  std::string token(name);
  for (char& c : token) {
    if (c == ':' || c == '=') c = '_';
  }
  return token + "." + std::to_string(::getpid()) + "." + suffix;
}

// Waits while a zombie that init (pid 1) has to reap started after the run did: a process of
// the run that ended by itself once orphaned (baton-keeper, after a clean stop) still shows in
// `pgrep` until then, and some init processes reap only now and then.
void AwaitOrphanZombies(uint64_t run_started, std::chrono::steady_clock::time_point deadline) {
  while (std::chrono::steady_clock::now() < deadline) {
    bool waiting = false;
    for (pid_t pid : ListPids()) {
      const std::optional<ProcStat> stat = ReadProcStat(pid);
      waiting = waiting || (stat.has_value() && stat->state == 'Z' && stat->ppid == 1 &&
                            stat->start_ticks >= run_started);
    }
    if (!waiting) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// What the run wrote to the pipe until it closed: "R<path>\n" for a folder to remove if the
// run is interrupted, "E\n" when it ended by returning or exit().
std::string ReadUntilClosed(int fd) {
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n > 0) {
      out.append(buf, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      return out;
    }
  }
}

// The run's controllers are asked to stop (SIGTERM) and given kGentleLimit to end: a clean
// stop stops their engines and removes their cgroups.
void StopControllersGently(const std::string& token) {
  const std::vector<pid_t> self = {::getpid()};
  std::vector<pid_t> asked;
  for (pid_t pid : TaggedProcesses(kRunGuardVariable, token, self)) {
    if (ProcessName(pid) != "baton-controlle") continue;  // comm: 15 bytes of baton-controller
    if (::kill(pid, SIGTERM) == 0) asked.push_back(pid);
  }
  const auto deadline = std::chrono::steady_clock::now() + RunGuard::kGentleLimit;
  for (pid_t pid : asked) {
    while (ProcessPresent(pid) && std::chrono::steady_clock::now() < deadline) {
      const std::optional<ProcStat> stat = ReadProcStat(pid);
      if (stat.has_value() && stat->state == 'Z') break;  // ended; its parent reaps it
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
}

void RemoveFoldersIfInterrupted(const std::string& said, const std::string& name) {
  std::vector<std::string> folders;
  size_t start = 0;
  for (size_t nl; (nl = said.find('\n', start)) != std::string::npos; start = nl + 1) {
    const std::string line = said.substr(start, nl - start);
    if (line == "E") return;  // ended by returning or exit(): its own code kept or removed them
    if (line.size() > 1 && line[0] == 'R') folders.push_back(line.substr(1));
  }
  for (const std::string& folder : folders) {
    std::error_code ec;
    if (std::filesystem::remove_all(folder, ec) > 0) {
      std::fprintf(stderr, "%s: removed %s: the run was interrupted\n", name.c_str(),
                   folder.c_str());
    }
  }
}

// The reaper: waits for the pipe to close, then sweeps. Runs in the forked child.
[[noreturn]] void ReaperMain(int read_fd, const GuardState& state) {
  ::setpgid(0, 0);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGTSTP, SIGTTIN, SIGTTOU, SIGPIPE}) {
    ::signal(sig, SIG_IGN);
  }
  // Hold nothing of the run's but the pipe and stderr: a socket or a pipe of the run's that
  // stayed open here would keep its peer waiting.
  if (::dup2(read_fd, 3) < 0) ::_exit(1);
  SweepFdsFrom(4, FdSweep::kClose);
  const int null_fd = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  if (null_fd >= 0) {
    ::dup2(null_fd, STDIN_FILENO);
    ::dup2(null_fd, STDOUT_FILENO);
  }
  const std::string said = ReadUntilClosed(3);
  std::string names;
  const auto deadline = std::chrono::steady_clock::now() + RunGuard::kSweepLimit;
  StopControllersGently(state.token);
  const int killed = KillTaggedProcesses(
      state.token, std::chrono::duration_cast<std::chrono::milliseconds>(RunGuard::kSweepLimit),
      &names);
  if (killed > 0) {
    std::fprintf(stderr, "%s: stopped %d process%s the run left behind:%s\n", state.name.c_str(),
                 killed, killed == 1 ? "" : "es", names.c_str());
  }
  AwaitOrphanZombies(state.started_ticks, deadline);
  RemoveFoldersIfInterrupted(said, state.name);
  ::_exit(0);
}

// Reaps this process's children until the reaper is one of them. Async-signal-safe.
void WaitForReaper(pid_t reaper) {
  while (true) {
    int status = 0;
    const pid_t r = ::waitpid(-1, &status, 0);
    if (r == reaper) return;
    if (r < 0 && errno != EINTR) return;  // ECHILD: someone reaped it already
  }
}

// Async-signal-safe: write(2) of a short line.
void Say(const char* line, size_t size) {
  const int fd = State().write_fd;
  if (fd < 0) return;
  while (::write(fd, line, size) < 0 && errno == EINTR) {
  }
}

void OnExit() {
  GuardState& state = State();
  if (state.owner == ::getpid() && !g_finishing) Say("E\n", 2);
  RunGuard::Finish();
}

void OnSignal(int sig) {
  RunGuard::Finish();
  if (g_signal_hook != nullptr) g_signal_hook(sig);
  ::signal(sig, SIG_DFL);
  ::raise(sig);  // delivered once the handler returns: the process ends as it would have
}

void InstallSignalHandlers() {
  for (int sig : kSignals) {
    struct sigaction old {};
    if (::sigaction(sig, nullptr, &old) != 0 || old.sa_handler != SIG_DFL) continue;
    struct sigaction act {};
    act.sa_handler = OnSignal;
    sigemptyset(&act.sa_mask);
    for (int s : kSignals) sigaddset(&act.sa_mask, s);
    ::sigaction(sig, &act, nullptr);
  }
}

}  // namespace

Status RunGuard::Install(std::string_view name) {
  GuardState& state = State();
  // A fork of a guarded process may guard itself (its token is nested in the parent's).
  if (state.owner == ::getpid()) return FailedPrecondition("a run guard is installed already");
  g_finishing = 0;
  state.name = std::string(name);
  state.token = NewToken(name);
  const char* outer = std::getenv(kRunGuardVariable);
  const std::string value =
      outer != nullptr && *outer != '\0' ? std::string(outer) + ":" + state.token : state.token;
  if (::setenv(kRunGuardVariable, value.c_str(), 1) != 0) return ErrnoStatus("setenv", errno);
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return ErrnoStatus("pipe2", errno);
  state.owner = ::getpid();
  const std::optional<ProcStat> self = ReadProcStat(state.owner);
  state.started_ticks = self.has_value() ? self->start_ticks : 0;
  const pid_t reaper = ::fork();
  if (reaper < 0) {
    const int err = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    state.owner = 0;
    return ErrnoStatus("fork", err);
  }
  if (reaper == 0) {
    ::close(fds[1]);
    ReaperMain(fds[0], state);
  }
  ::close(fds[0]);
  state.reaper = reaper;
  state.write_fd = fds[1];
  std::atexit(OnExit);
  InstallSignalHandlers();
  return OkStatus();
}

const std::string& RunGuard::token() { return State().token; }

pid_t RunGuard::reaper() { return State().reaper; }

void RunGuard::SetSignalHook(void (*hook)(int sig)) { g_signal_hook = hook; }

void RunGuard::RemoveIfInterrupted(const std::string& path) {
  const GuardState& state = State();
  if (state.owner != ::getpid() || g_finishing || path.empty() || path.size() > 1000) return;
  const std::string line = "R" + path + "\n";  // under PIPE_BUF: written whole
  Say(line.data(), line.size());
}

void RunGuard::Finish() {
  GuardState& state = State();
  if (state.owner != ::getpid() || g_finishing) return;  // a forked child, or done already
  g_finishing = 1;
  // What the sweep orphans (a killed controller's engines) comes here to be reaped at once,
  // not to init, whose reaping may lag.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  ::close(state.write_fd);
  WaitForReaper(state.reaper);
}

int KillTaggedProcesses(std::string_view token, std::chrono::milliseconds limit,
                        std::string* names) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  const std::vector<pid_t> self = {::getpid()};
  std::set<pid_t> killed;
  // Nothing is left once several scans in a row find nothing: a process in the middle of its
  // execve may show no environment to one scan.
  int empty_scans = 0;
  while (empty_scans < 3 && std::chrono::steady_clock::now() < deadline) {
    const std::vector<pid_t> tagged = TaggedProcesses(kRunGuardVariable, token, self);
    empty_scans = tagged.empty() ? empty_scans + 1 : 0;
    // Stopped first, then killed: none of them reacts to another's death meanwhile (a
    // controller starts a new keeper when its keeper dies).
    for (pid_t pid : tagged) ::kill(pid, SIGSTOP);
    for (pid_t pid : tagged) {
      if (killed.insert(pid).second && names != nullptr) {
        *names += " " + std::to_string(pid) + " " + ProcessName(pid);
      }
      ::kill(pid, SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(tagged.empty() ? 20 : 5));
  }
  // Gone, not only dead: a zombie still shows in `pgrep` until its parent reaps it.
  for (pid_t pid : killed) {
    while (ProcessPresent(pid) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  return static_cast<int>(killed.size());
}

}  // namespace baton
