// Failpoints: named places in the daemons where a test makes the process die at once, as
// kill -9 would, to prove that a successor recovers from exactly that moment.
//
//   BATON_FAILPOINT("after_fence");
//
// They are off unless the environment variable BATON_FAILPOINTS names them when the process
// starts: "name" fires on the first hit, "name:N" on the N-th, several separated by commas
// ("after_fence,mid_journal_write:3"). A firing failpoint writes one line to stderr
// ("failpoint NAME: dying here (hit N)") and raises SIGKILL. "name:N:stall" (or "name:stall")
// instead stops the thread that hits it for good ("failpoint NAME: stalling this thread (hit
// N)"), as a deadlock or a kernel that never ends would, while the process's other threads go
// on. Off, a failpoint costs one load of a flag. docs/operations.md lists the points.
// Thread-safe.
#pragma once

#include <atomic>

namespace baton {

namespace failpoint_internal {
extern std::atomic<bool> enabled;
void Hit(const char* name);
}  // namespace failpoint_internal

// Reads BATON_FAILPOINTS again (tests of this module only; daemons read it once).
void ReloadFailpointsForTesting();
// Times `name` was passed since the start (counted only while failpoints are enabled).
int FailpointHits(const char* name);

}  // namespace baton

#define BATON_FAILPOINT(name)                                                   \
  do {                                                                          \
    if (::baton::failpoint_internal::enabled.load(std::memory_order_relaxed)) { \
      ::baton::failpoint_internal::Hit(name);                                   \
    }                                                                           \
  } while (0)
