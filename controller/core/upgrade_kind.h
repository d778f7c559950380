// What an engine-version change is (an upgrade, or a rollback to the previous command), the
// phase it is in, and how it ended. In memory these enums; the names are written and read
// only by the status JSON, the command record, batonctl's text and the log.
//
// Plain values; any thread.
#pragma once

#include <cstdint>
#include <string_view>

#include "base/status.h"

namespace baton {

enum class UpgradeKind : uint8_t {
  kUpgrade,   // to a new engine command
  kRollback,  // back to the command the pair ran before
};
inline constexpr UpgradeKind kUpgradeKinds[] = {UpgradeKind::kUpgrade, UpgradeKind::kRollback};

// "upgrade", "rollback".
const char* ToString(UpgradeKind kind);
// The kind named `text`; InvalidArgument naming it when it names none.
Result<UpgradeKind> ParseUpgradeKind(std::string_view text);

// The phases of an upgrade in flight, in order (controller/upgrade/upgrade.h tells each).
enum class UpgradePhase : uint8_t {
  kLaunching,
  kReclaiming,
  kPromoting,
  kCanary,
  kFinishing,
  kRollingBack,
};
inline constexpr UpgradePhase kUpgradePhases[] = {
    UpgradePhase::kLaunching, UpgradePhase::kReclaiming, UpgradePhase::kPromoting,
    UpgradePhase::kCanary,    UpgradePhase::kFinishing,  UpgradePhase::kRollingBack};

// "launching", "reclaiming", "promoting", "canary", "finishing", "rolling_back".
const char* ToString(UpgradePhase phase);
// The phase named `text`; InvalidArgument naming it when it names none.
Result<UpgradePhase> ParseUpgradePhase(std::string_view text);

enum class UpgradeOutcome : uint8_t {
  kPromoted,    // the candidate serves alone
  kRolledBack,  // the candidate is gone; the previous command serves
};
inline constexpr UpgradeOutcome kUpgradeOutcomes[] = {UpgradeOutcome::kPromoted,
                                                      UpgradeOutcome::kRolledBack};

// "promoted", "rolled_back".
const char* ToString(UpgradeOutcome outcome);
// The outcome named `text`; InvalidArgument naming it when it names none.
Result<UpgradeOutcome> ParseUpgradeOutcome(std::string_view text);

}  // namespace baton
