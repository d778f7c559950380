// Checks of invariants: conditions that hold unless the program itself is wrong.
//
//   BATON_CHECK(cond) << "context";   aborts when cond is false, in every build: for a broken
//                                     invariant after which going on would lose or corrupt
//                                     state (a block lent twice, a record that must exist).
//   BATON_DCHECK(cond) << "context";  the same in builds without NDEBUG (Debug); elsewhere the
//                                     condition is compiled but neither evaluated nor checked.
//
// A failed check writes "FILE:LINE: check failed: COND: CONTEXT" to stderr and aborts (a core
// dump where enabled). Never for bad input, a peer's misbehaviour or a failed system call:
// those are a Status (base/status.h) and the caller decides.
#pragma once

#include <sstream>

namespace baton::internal {

// Collects a failed check's context; its destructor reports it and aborts.
class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* condition);
  CheckFailure(const CheckFailure&) = delete;
  CheckFailure& operator=(const CheckFailure&) = delete;
  ~CheckFailure();  // does not return

  std::ostream& stream() { return context_; }

 private:
  const char* file_;
  int line_;
  const char* condition_;
  std::ostringstream context_;
};

}  // namespace baton::internal

#define BATON_CHECK(cond) \
  while (!(cond)) ::baton::internal::CheckFailure(__FILE__, __LINE__, #cond).stream()

#ifdef NDEBUG
#define BATON_DCHECK(cond) \
  while (false && (cond)) ::baton::internal::CheckFailure(__FILE__, __LINE__, #cond).stream()
#else
#define BATON_DCHECK(cond) BATON_CHECK(cond)
#endif
