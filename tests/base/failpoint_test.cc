#include "base/failpoint.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

namespace baton {
namespace {

class FailpointTest : public ::testing::Test {
 protected:
  void TearDown() override {
    ::unsetenv("BATON_FAILPOINTS");
    ReloadFailpointsForTesting();
  }
};

TEST_F(FailpointTest, OffUnlessNamedAndCountedWhenOn) {
  ::unsetenv("BATON_FAILPOINTS");
  ReloadFailpointsForTesting();
  BATON_FAILPOINT("anything");
  EXPECT_EQ(FailpointHits("anything"), 0) << "off: not even counted";
  ::setenv("BATON_FAILPOINTS", "elsewhere,later:3", 1);
  ReloadFailpointsForTesting();
  BATON_FAILPOINT("here");
  BATON_FAILPOINT("later");
  BATON_FAILPOINT("later");
  EXPECT_EQ(FailpointHits("here"), 1);
  EXPECT_EQ(FailpointHits("later"), 2) << "fires on the third hit, not before";
}

TEST_F(FailpointTest, FiresAsKillMinusNineOnTheNamedHit) {
  EXPECT_EXIT(
      {
        ::setenv("BATON_FAILPOINTS", "after_fence:2", 1);
        ReloadFailpointsForTesting();
        BATON_FAILPOINT("after_fence");
        BATON_FAILPOINT("after_fence");
        std::exit(0);  // not reached
      },
      ::testing::KilledBySignal(SIGKILL), "failpoint after_fence: dying here \\(hit 2\\)");
}

}  // namespace
}  // namespace baton
