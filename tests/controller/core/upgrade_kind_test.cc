#include "controller/core/upgrade_kind.h"

#include <gtest/gtest.h>

#include <string>

namespace baton {
namespace {

TEST(UpgradeKindTest, EveryKindRoundTrips) {
  for (UpgradeKind kind : kUpgradeKinds) {
    Result<UpgradeKind> back = ParseUpgradeKind(ToString(kind));
    ASSERT_TRUE(back.ok()) << ToString(kind) << ": " << back.status().ToString();
    EXPECT_EQ(*back, kind) << ToString(kind);
  }
  Result<UpgradeKind> bad = ParseUpgradeKind("downgrade");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("unknown upgrade kind 'downgrade' (upgrade or rollback)"),
            std::string::npos)
      << bad.status().message();
}

TEST(UpgradeKindTest, EveryPhaseRoundTrips) {
  for (UpgradePhase phase : kUpgradePhases) {
    Result<UpgradePhase> back = ParseUpgradePhase(ToString(phase));
    ASSERT_TRUE(back.ok()) << ToString(phase) << ": " << back.status().ToString();
    EXPECT_EQ(*back, phase) << ToString(phase);
  }
  // The names batonctl status, the command record and DESIGN.md's operator contract use.
  EXPECT_STREQ(ToString(UpgradePhase::kFinishing), "finishing");
  EXPECT_STREQ(ToString(UpgradePhase::kRollingBack), "rolling_back");
}

TEST(UpgradeKindTest, AnUnknownPhaseIsRefused) {
  for (const char* text : {"warming", "", "Canary", "rolling back"}) {
    Result<UpgradePhase> bad = ParseUpgradePhase(text);
    ASSERT_FALSE(bad.ok()) << text;
    EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(bad.status().message().find("unknown upgrade phase '" + std::string(text) + "'"),
              std::string::npos)
        << bad.status().message();
  }
}

TEST(UpgradeKindTest, EveryOutcomeRoundTrips) {
  for (UpgradeOutcome outcome : kUpgradeOutcomes) {
    Result<UpgradeOutcome> back = ParseUpgradeOutcome(ToString(outcome));
    ASSERT_TRUE(back.ok()) << ToString(outcome) << ": " << back.status().ToString();
    EXPECT_EQ(*back, outcome) << ToString(outcome);
  }
  Result<UpgradeOutcome> bad = ParseUpgradeOutcome("rolled back");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("unknown upgrade outcome 'rolled back'"), std::string::npos)
      << bad.status().message();
}

}  // namespace
}  // namespace baton
