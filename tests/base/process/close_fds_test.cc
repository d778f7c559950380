#include "base/process/close_fds.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>

namespace baton {
namespace {

// Runs `sweep` in a forked child holding descriptors 3 (kept by nobody), 9 (the one to
// keep), and one far above 1024 (the old sweeps stopped at 1024 or 65536): the child's exit
// status says what was left open: bit 0 for 3, bit 1 for 9, bit 2 for the high one, bit 3
// for 9 not being close-on-exec.
int SurvivorsAfter(const std::function<void(int keep)>& sweep) {
  rlimit limit{};
  EXPECT_EQ(::getrlimit(RLIMIT_NOFILE, &limit), 0);
  const int high = static_cast<int>(limit.rlim_cur) - 1;
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int null_fd = ::open("/dev/null", O_RDONLY);
    if (null_fd < 0 || ::dup2(null_fd, 3) < 0 || ::dup3(null_fd, 9, O_CLOEXEC) < 0 ||
        ::dup2(null_fd, high) < 0) {
      ::_exit(100);
    }
    if (null_fd != 3 && null_fd != 9) ::close(null_fd);
    sweep(9);
    int survivors = 0;
    for (int bit = 0; const int fd : {3, 9, high}) {
      if (::fcntl(fd, F_GETFD) >= 0 && (::fcntl(fd, F_GETFD) & FD_CLOEXEC) == 0) {
        survivors |= 1 << bit;  // open and inherited by an exec
      }
      ++bit;
    }
    if (::fcntl(9, F_GETFD) < 0) survivors |= 8;
    ::_exit(survivors);
  }
  int status = 0;
  EXPECT_EQ(::waitpid(pid, &status, 0), pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(SweepFdsFrom, ClosesEverythingButTheKeptOneWhateverItsNumber) {
  EXPECT_EQ(SurvivorsAfter([](int keep) { SweepFdsFrom(3, FdSweep::kClose, keep); }), 0);
  // Nothing kept: 9 is closed too.
  EXPECT_EQ(SurvivorsAfter([](int) { SweepFdsFrom(3, FdSweep::kClose); }), 8);
}

TEST(SweepFdsFrom, MarksEverythingCloseOnExecAndKeepsThePipeUsable) {
  EXPECT_EQ(SurvivorsAfter([](int keep) { SweepFdsFrom(3, FdSweep::kCloseOnExec, keep); }), 0);
}

TEST(SweepFdsFrom, TheFallbackReachesTheDescriptorLimit) {
  EXPECT_EQ(SurvivorsAfter([](int keep) { CloseFdsByNumber(3, keep); }), 0);
  EXPECT_EQ(SurvivorsAfter([](int keep) { CloseFdsByNumber(10, keep); }), 1);  // 3 is below
}

}  // namespace
}  // namespace baton
