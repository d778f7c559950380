// RaiseFdLimit: lifts the soft RLIMIT_NOFILE to the hard limit, for processes that hold one
// fd per device memory chunk (baton-keeper and the controller on the CUDA backend: hundreds
// of chunks). Returns the soft limit in force afterwards (the old one when setrlimit fails).
// Call it at start-up, before threads. Thread-safe as setrlimit is.
#pragma once

#include <cstdint>

namespace baton {

uint64_t RaiseFdLimit();

}  // namespace baton
