#include "controller/core/upgrade_kind.h"

#include <string>

namespace baton {

const char* ToString(UpgradeKind kind) {
  switch (kind) {
    case UpgradeKind::kUpgrade:
      return "upgrade";
    case UpgradeKind::kRollback:
      return "rollback";
  }
  return "unknown";
}

Result<UpgradeKind> ParseUpgradeKind(std::string_view text) {
  for (UpgradeKind kind : kUpgradeKinds) {
    if (text == ToString(kind)) return kind;
  }
  return InvalidArgument("unknown upgrade kind '" + std::string(text) + "' (upgrade or rollback)");
}

const char* ToString(UpgradeOutcome outcome) {
  switch (outcome) {
    case UpgradeOutcome::kPromoted:
      return "promoted";
    case UpgradeOutcome::kRolledBack:
      return "rolled_back";
  }
  return "unknown";
}

Result<UpgradeOutcome> ParseUpgradeOutcome(std::string_view text) {
  for (UpgradeOutcome outcome : kUpgradeOutcomes) {
    if (text == ToString(outcome)) return outcome;
  }
  return InvalidArgument("unknown upgrade outcome '" + std::string(text) +
                         "' (promoted or rolled_back)");
}

}  // namespace baton
