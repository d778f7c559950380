// SweepFdsFrom: what a child does with its parent's descriptors between fork and exec, so
// that a daemon's sockets, pipes and memfds do not live on in a process it starts (an engine,
// baton-keeper, a reaper): every descriptor numbered `first` or above, except `keep` (-1:
// none), is closed (kClose) or marked close-on-exec (kCloseOnExec: it stays usable until the
// exec, as an exec-error pipe must; `keep` must be close-on-exec already). close_range(2)
// does it in one call where the kernel has it (5.9; close-on-exec from 5.11: before, they
// are closed, around `keep`); otherwise every number below the soft RLIMIT_NOFILE is closed
// one by one, whatever that limit is (a descriptor opened before the limit was lowered below
// it would stay: Baton only raises it). The loop costs a close per number (about a million
// under LimitNOFILE=1048576) and runs only where the kernel lacks close_range (before 5.9).
// Async-signal-safe: system calls only.
#pragma once

namespace baton {

enum class FdSweep { kClose, kCloseOnExec };

void SweepFdsFrom(int first, FdSweep how, int keep = -1);

// The fallback alone, for its test: closes every descriptor from `first` below the soft
// RLIMIT_NOFILE but `keep`. Async-signal-safe.
void CloseFdsByNumber(int first, int keep);

}  // namespace baton
