// DrillKind: how `batonctl drill` makes the primary misbehave. In memory this enum; the name
// is text only on batonctl's command line, in the failover's timeline cause, in the log and
// in the InjectFault the controller sends for kError.
//
// Plain values; any thread.
#pragma once

#include <cstdint>
#include <string_view>

#include "base/status.h"

namespace baton {

enum class DrillKind : uint8_t {
  kKill,   // SIGKILL, without a fence
  kHang,   // frozen: its cgroup, or its process group stopped
  kError,  // its SDK reports an asynchronous error
};
inline constexpr DrillKind kDrillKinds[] = {DrillKind::kKill, DrillKind::kHang, DrillKind::kError};

// "kill", "hang", "error".
const char* ToString(DrillKind kind);
// The drill named `text`; InvalidArgument naming it when it names none.
Result<DrillKind> ParseDrillKind(std::string_view text);

}  // namespace baton
