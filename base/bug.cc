#include "base/bug.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "base/log.h"

namespace baton {
namespace {

std::atomic<uint64_t> bugs{0};
// -1: not decided yet (the environment is read at the first bug); 0 or 1 once decided.
std::atomic<int> abort_on_bug{-1};

}  // namespace

uint64_t BugCount() { return bugs.load(std::memory_order_relaxed); }

void SetAbortOnBug(bool abort) { abort_on_bug.store(abort ? 1 : 0); }

bool AbortOnBug() {
  int decided = abort_on_bug.load();
  if (decided < 0) {
    const char* env = std::getenv("BATON_ABORT_ON_BUG");
    const int from_env = env != nullptr && std::strcmp(env, "1") == 0 ? 1 : 0;
    abort_on_bug.compare_exchange_strong(decided, from_env);
    decided = abort_on_bug.load();
  }
  return decided == 1;
}

namespace internal {

BugReport::BugReport(const char* file, int line, const char* category)
    : file_(file), line_(line), category_(category) {}

BugReport::~BugReport() {
  bugs.fetch_add(1, std::memory_order_relaxed);
  const std::string context = context_.str();
  const char* base = std::strrchr(file_, '/');
  BATON_LOG(ERROR, "bug") << "bug (" << category_ << "): " << context << " ["
                          << (base != nullptr ? base + 1 : file_) << ":" << line_ << "]";
  if (AbortOnBug()) {
    std::fprintf(stderr, "%s:%d: bug (%s): %s\n", file_, line_, category_, context.c_str());
    std::fflush(stderr);
    std::abort();
  }
}

}  // namespace internal
}  // namespace baton
