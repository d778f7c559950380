// Bugs that count: the program found itself wrong, in a place where stopping would make a
// production outage of it.
//
//   BATON_BUG("ledger") << "the ledger refused the coordinator's own grant: " << status;
//
// logs "bug (ledger): CONTEXT" at ERROR with the file and line, adds one to the process's
// count (BugCount(), the metric baton_bugs_total) and returns, so that the daemon goes on
// serving; in a process that asked for it (SetAbortOnBug(true): every GoogleTest binary, the
// simulation, and a daemon started with BATON_ABORT_ON_BUG=1 in its environment) it aborts
// instead, so that a test cannot pass over a bug. Not for bad input, a peer's misbehaviour or
// a failed system call: those are a Status. Not for an invariant after which going on would
// lose or corrupt state: that is BATON_CHECK (base/check.h).
//
// Thread-safe: the count is atomic, the abort flag is read once per bug.
#pragma once

#include <cstdint>
#include <sstream>

namespace baton {

// Bugs reported in this process since it started.
uint64_t BugCount();
// Whether BATON_BUG aborts; the default is false, or true when BATON_ABORT_ON_BUG=1 was in
// the environment at the first bug.
void SetAbortOnBug(bool abort);
bool AbortOnBug();

namespace internal {

// Collects a bug's context; its destructor logs it, counts it and, when asked, aborts.
class BugReport {
 public:
  BugReport(const char* file, int line, const char* category);
  BugReport(const BugReport&) = delete;
  BugReport& operator=(const BugReport&) = delete;
  ~BugReport();

  std::ostream& stream() { return context_; }

 private:
  const char* file_;
  int line_;
  const char* category_;
  std::ostringstream context_;
};

}  // namespace internal
}  // namespace baton

#define BATON_BUG(category) ::baton::internal::BugReport(__FILE__, __LINE__, category).stream()
