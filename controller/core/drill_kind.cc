#include "controller/core/drill_kind.h"

#include <iterator>

#include "base/text/enum_names.h"

namespace baton {
namespace {

constexpr EnumNames<DrillKind, 3> kNames{
    "drill",
    {{{DrillKind::kKill, "kill"}, {DrillKind::kHang, "hang"}, {DrillKind::kError, "error"}}}};
static_assert(kNames.entries.size() == std::size(kDrillKinds));

}  // namespace

const char* ToString(DrillKind kind) { return kNames.Name(kind); }

Result<DrillKind> ParseDrillKind(std::string_view text) { return kNames.Parse(text); }

}  // namespace baton
