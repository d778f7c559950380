// A process that listens at a Unix socket and never accepts: to a client, a server that runs
// but never answers (a deadlocked baton-keeper, when it is named so). Header-only; for tests.
#pragma once

#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstring>
#include <string>
#include <thread>

namespace baton::testing_support {

// Forks a child named `name` (its /proc comm) that listens at `socket` until killed; returns
// its pid once it listens, or -1. The caller reaps it. The child makes system calls only (a
// test may have threads).
inline pid_t StartSilentListener(const std::string& socket, const char* name) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, socket.c_str(), sizeof(addr.sun_path) - 1);
  int ready[2];
  if (::pipe(ready) != 0) return -1;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_NAME, name);
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        ::listen(fd, SOMAXCONN) != 0) {
      ::_exit(1);
    }
    (void)!::write(ready[1], "x", 1);
    while (true) ::pause();
  }
  ::close(ready[1]);
  char byte = 0;
  const bool listening = pid > 0 && ::read(ready[0], &byte, 1) == 1;
  ::close(ready[0]);
  return listening ? pid : -1;
}

// Reaps the child `pid`: its wait status once it has exited, within `within`; otherwise it is
// killed and reaped, and -1 returned (so that a test that expected it gone fails, not hangs).
inline int ReapWithin(pid_t pid, std::chrono::milliseconds within) {
  int status = 0;
  const auto until = std::chrono::steady_clock::now() + within;
  while (std::chrono::steady_clock::now() < until) {
    if (::waitpid(pid, &status, WNOHANG) == pid) return status;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  return -1;
}

}  // namespace baton::testing_support
