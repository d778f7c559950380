#include "base/process/close_fds.h"

#include <linux/close_range.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace baton {
namespace {

bool CloseRange(unsigned first, unsigned last, unsigned flags) {
  return first > last || ::syscall(SYS_close_range, first, last, flags) == 0;
}

}  // namespace

void CloseFdsByNumber(int first, int keep) {
  rlimit limit{};
  // Without a limit to read (it cannot fail for RLIMIT_NOFILE), the kernel's default ceiling
  // (fs.nr_open, which the limit cannot exceed).
  rlim_t end = ::getrlimit(RLIMIT_NOFILE, &limit) == 0 ? limit.rlim_cur : 1 << 20;
  if (end == RLIM_INFINITY) end = 1 << 20;
  for (rlim_t fd = static_cast<rlim_t>(first); fd < end; ++fd) {
    if (static_cast<int>(fd) != keep) ::close(static_cast<int>(fd));
  }
}

void SweepFdsFrom(int first, FdSweep how, int keep) {
  const auto from = static_cast<unsigned>(first);
  if (how == FdSweep::kCloseOnExec && CloseRange(from, ~0U, CLOSE_RANGE_CLOEXEC)) return;
  // Closed (a kernel without the close-on-exec sweep: nothing of them is used before the
  // exec), around `keep`.
  bool closed = false;
  if (keep < first) {
    closed = CloseRange(from, ~0U, 0);
  } else {
    const auto k = static_cast<unsigned>(keep);
    closed = (k == from || CloseRange(from, k - 1, 0)) && CloseRange(k + 1, ~0U, 0);
  }
  if (!closed) CloseFdsByNumber(first, keep);
}

}  // namespace baton
