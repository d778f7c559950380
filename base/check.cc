#include "base/check.h"

#include <cstdio>
#include <cstdlib>
#include <string>

namespace baton::internal {

CheckFailure::CheckFailure(const char* file, int line, const char* condition)
    : file_(file), line_(line), condition_(condition) {}

CheckFailure::~CheckFailure() {
  const std::string context = context_.str();
  std::fprintf(stderr, "%s:%d: check failed: %s%s%s\n", file_, line_, condition_,
               context.empty() ? "" : ": ", context.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace baton::internal
