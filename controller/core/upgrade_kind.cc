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

const char* ToString(UpgradePhase phase) {
  switch (phase) {
    case UpgradePhase::kLaunching:
      return "launching";
    case UpgradePhase::kReclaiming:
      return "reclaiming";
    case UpgradePhase::kPromoting:
      return "promoting";
    case UpgradePhase::kCanary:
      return "canary";
    case UpgradePhase::kFinishing:
      return "finishing";
    case UpgradePhase::kRollingBack:
      return "rolling_back";
  }
  return "unknown";
}

Result<UpgradePhase> ParseUpgradePhase(std::string_view text) {
  for (UpgradePhase phase : kUpgradePhases) {
    if (text == ToString(phase)) return phase;
  }
  return InvalidArgument("unknown upgrade phase '" + std::string(text) +
                         "' (launching, reclaiming, promoting, canary, finishing or rolling_back)");
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
