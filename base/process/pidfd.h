// pidfds: a process named by an fd rather than a pid, so a signal never reaches another
// process that reused the pid. Thin wrappers of the syscalls (glibc has no wrapper for
// pidfd_send_signal on every Debian release Baton builds on). Thread-safe.
#pragma once

#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

namespace baton {

// A pidfd of `pid` (close-on-exec), or -1 with errno set.
inline int PidfdOpen(pid_t pid) { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)); }

// Sends `sig` to the process of `pidfd`: 0, or -1 with errno set (ESRCH: it is gone).
inline int PidfdSendSignal(int pidfd, int sig) {
  return static_cast<int>(::syscall(SYS_pidfd_send_signal, pidfd, sig, nullptr, 0));
}

}  // namespace baton
