#include "controller/core/drill_kind.h"

#include <string>

namespace baton {

const char* ToString(DrillKind kind) {
  switch (kind) {
    case DrillKind::kKill:
      return "kill";
    case DrillKind::kHang:
      return "hang";
    case DrillKind::kError:
      return "error";
  }
  return "unknown";
}

Result<DrillKind> ParseDrillKind(std::string_view text) {
  for (DrillKind kind : kDrillKinds) {
    if (text == ToString(kind)) return kind;
  }
  return InvalidArgument("unknown drill '" + std::string(text) + "' (kill, hang or error)");
}

}  // namespace baton
