#include "controller/engines/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>

#include "base/process/pidfd.h"

namespace baton {
namespace {

ExitInfo FromSiginfo(const siginfo_t& info) {
  ExitInfo exit;
  if (info.si_code == CLD_EXITED) {
    exit.code = info.si_status;
  } else {
    exit.signal = info.si_status;
    exit.dumped = info.si_code == CLD_DUMPED;
  }
  return exit;
}

std::string ReadBootId() {
  char buf[64] = {};
  const int fd = ::open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  std::string id(buf, n > 0 ? static_cast<size_t>(n) : 0);
  while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
  return id;
}

}  // namespace

std::string ExitInfo::ToString() const {
  if (unknown) return "exited (not this controller's child: how is not known)";
  std::string how = "exited with status " + std::to_string(code);
  if (signal != 0) {
    const char* name = ::sigabbrev_np(signal);
    how = std::string("killed by SIG") + (name != nullptr ? name : std::to_string(signal)) +
          (dumped ? " (core dumped)" : "");
  }
  return start_error.empty() ? how : "could not start: " + start_error + " (" + how + ")";
}

ChildProcess::~ChildProcess() { KillAndReap(); }

ChildProcess::ChildProcess(ChildProcess&& other) noexcept
    : pid_(std::exchange(other.pid_, 0)),
      pidfd_(std::move(other.pidfd_)),
      exit_(std::move(other.exit_)),
      adopted_(std::exchange(other.adopted_, false)),
      command_(std::move(other.command_)),
      start_errors_(std::move(other.start_errors_)) {}

ChildProcess& ChildProcess::operator=(ChildProcess&& other) noexcept {
  if (this != &other) {
    KillAndReap();
    pid_ = std::exchange(other.pid_, 0);
    pidfd_ = std::move(other.pidfd_);
    exit_ = std::move(other.exit_);
    adopted_ = std::exchange(other.adopted_, false);
    command_ = std::move(other.command_);
    start_errors_ = std::move(other.start_errors_);
  }
  return *this;
}

uint64_t ChildProcess::StartTime(pid_t pid) {
  const std::string path = "/proc/" + std::to_string(pid) + "/stat";
  char buf[1024];
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  if (n <= 0) return 0;
  buf[n] = '\0';
  // After "pid (comm)": state is field 3, starttime field 22, so 19 fields after the state.
  const char* p = std::strrchr(buf, ')');
  if (p == nullptr) return 0;
  ++p;
  for (int field = 3; field < 22 && *p != '\0'; ++field) {
    while (*p == ' ') ++p;
    while (*p != ' ' && *p != '\0') ++p;
  }
  unsigned long long start = 0;
  return std::sscanf(p, " %llu", &start) == 1 ? start : 0;
}

Result<ChildProcess> ChildProcess::Adopt(pid_t pid, uint64_t start_time) {
  if (pid <= 0) return InvalidArgument("adopting pid " + std::to_string(pid));
  UniqueFd pidfd(PidfdOpen(pid));
  if (!pidfd) {
    if (errno == ESRCH) return NotFound("pid " + std::to_string(pid) + " has exited");
    return ErrnoStatus("pidfd_open of pid " + std::to_string(pid), errno);
  }
  // Checked after the pidfd is open: from here on the pid cannot be recycled under us.
  const uint64_t now = StartTime(pid);
  if (start_time != 0 && now != start_time) {
    return NotFound("pid " + std::to_string(pid) + " is another process now (started at tick " +
                    std::to_string(now) + ", not " + std::to_string(start_time) + ")");
  }
  ChildProcess process(pid, std::move(pidfd));
  process.adopted_ = true;
  return process;
}

void ChildProcess::Release() {
  pidfd_.Reset();
  start_errors_.Reset();
  pid_ = 0;
}

Status ChildProcess::Signal(int sig) {
  if (!pidfd_ || exit_.has_value()) return OkStatus();
  if (PidfdSendSignal(pidfd_.get(), sig) != 0 && errno != ESRCH) {
    return ErrnoStatus("pidfd_send_signal to pid " + std::to_string(pid_), errno);
  }
  return OkStatus();
}

Status ChildProcess::SignalGroup(int sig) {
  if (pid_ <= 0) return OkStatus();
  if (::kill(-pid_, sig) != 0 && errno != ESRCH) {
    return ErrnoStatus("kill of process group " + std::to_string(pid_), errno);
  }
  return OkStatus();
}

bool ProcessGroupAlive(pid_t pgid) {
  if (pgid <= 0) return false;
  while (::waitpid(-pgid, nullptr, WNOHANG) > 0) {
  }
  if (::kill(-pgid, 0) != 0 && errno == ESRCH) return false;
  // Members are left; zombies among them (orphans whose reaper is slow) hold no memory.
  return !ProcessGroupMembers(pgid).empty();
}

std::vector<pid_t> ProcessGroupMembers(pid_t pgid) {
  std::vector<pid_t> members;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    // /proc/PID/stat: "pid (comm) state ppid pgrp ...", comm may hold spaces and parentheses.
    char buf[512];
    const int fd = ::open((entry.path() / "stat").c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
    ::close(fd);
    if (n <= 0) continue;
    buf[n] = '\0';
    const char* paren = std::strrchr(buf, ')');
    char state = 0;
    long ppid = 0, group = 0;
    if (paren == nullptr || std::sscanf(paren + 1, " %c %ld %ld", &state, &ppid, &group) != 3) {
      continue;
    }
    if (group == pgid && state != 'Z' && state != 'X') {
      members.push_back(static_cast<pid_t>(std::stol(name)));
    }
  }
  return members;
}

Result<std::optional<ExitInfo>> ChildProcess::TryReap() {
  if (exit_.has_value()) return exit_;
  if (!pidfd_) return FailedPrecondition("no child process");
  if (adopted_) {  // not our child: waitid cannot reap it, its pidfd says whether it exited
    pollfd p{.fd = pidfd_.get(), .events = POLLIN, .revents = 0};
    if (::poll(&p, 1, 0) < 0) return ErrnoStatus("poll on pid " + std::to_string(pid_), errno);
    if ((p.revents & (POLLIN | POLLHUP)) == 0) return std::optional<ExitInfo>();
    exit_ = ExitInfo{.code = -1, .signal = 0, .dumped = false, .unknown = true, .start_error = ""};
    return exit_;
  }
  siginfo_t info;
  std::memset(&info, 0, sizeof(info));
  if (::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pidfd_.get()), &info,
               WEXITED | WNOHANG) != 0) {
    return ErrnoStatus("waitid on pid " + std::to_string(pid_), errno);
  }
  if (info.si_pid == 0) return std::optional<ExitInfo>();
  exit_ = FromSiginfo(info);
  exit_->start_error = ReadStartError();
  return exit_;
}

void ChildProcess::KillAndReap() {
  if (!pidfd_ || exit_.has_value()) return;
  (void)Signal(SIGKILL);
  (void)SignalGroup(SIGKILL);  // the leader is not reaped yet: the group id is still its own
  if (adopted_) {
    pollfd p{.fd = pidfd_.get(), .events = POLLIN, .revents = 0};
    while (::poll(&p, 1, 5000) < 0 && errno == EINTR) {
    }
    exit_ = ExitInfo{
        .code = -1, .signal = SIGKILL, .dumped = false, .unknown = true, .start_error = ""};
    return;
  }
  siginfo_t info;
  std::memset(&info, 0, sizeof(info));
  int rc;
  do {
    rc = ::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pidfd_.get()), &info, WEXITED);
  } while (rc != 0 && errno == EINTR);
  exit_ = rc == 0 ? FromSiginfo(info)
                  : ExitInfo{.code = -1,
                             .signal = SIGKILL,
                             .dumped = false,
                             .unknown = false,
                             .start_error = ""};
  exit_->start_error = ReadStartError();
}

// Read once: a process lives within one boot, and the roster is saved inside each failover.
const std::string& BootId() {
  static const std::string id = ReadBootId();
  return id;
}

}  // namespace baton
