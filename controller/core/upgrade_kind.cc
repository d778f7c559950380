#include "controller/core/upgrade_kind.h"

#include <iterator>

#include "base/text/enum_names.h"

namespace baton {
namespace {

constexpr EnumNames<UpgradeKind, 2> kKindNames{
    "upgrade kind", {{{UpgradeKind::kUpgrade, "upgrade"}, {UpgradeKind::kRollback, "rollback"}}}};
static_assert(kKindNames.entries.size() == std::size(kUpgradeKinds));

constexpr EnumNames<UpgradePhase, 6> kPhaseNames{"upgrade phase",
                                                 {{{UpgradePhase::kLaunching, "launching"},
                                                   {UpgradePhase::kReclaiming, "reclaiming"},
                                                   {UpgradePhase::kPromoting, "promoting"},
                                                   {UpgradePhase::kCanary, "canary"},
                                                   {UpgradePhase::kFinishing, "finishing"},
                                                   {UpgradePhase::kRollingBack, "rolling_back"}}}};
static_assert(kPhaseNames.entries.size() == std::size(kUpgradePhases));

constexpr EnumNames<UpgradeOutcome, 2> kOutcomeNames{
    "upgrade outcome",
    {{{UpgradeOutcome::kPromoted, "promoted"}, {UpgradeOutcome::kRolledBack, "rolled_back"}}}};
static_assert(kOutcomeNames.entries.size() == std::size(kUpgradeOutcomes));

}  // namespace

const char* ToString(UpgradeKind kind) { return kKindNames.Name(kind); }
Result<UpgradeKind> ParseUpgradeKind(std::string_view text) { return kKindNames.Parse(text); }

const char* ToString(UpgradePhase phase) { return kPhaseNames.Name(phase); }
Result<UpgradePhase> ParseUpgradePhase(std::string_view text) { return kPhaseNames.Parse(text); }

const char* ToString(UpgradeOutcome outcome) { return kOutcomeNames.Name(outcome); }
Result<UpgradeOutcome> ParseUpgradeOutcome(std::string_view text) {
  return kOutcomeNames.Parse(text);
}

}  // namespace baton
