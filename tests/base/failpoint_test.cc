#include "base/failpoint.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <thread>

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

// ":stall" stops the thread that hits it for good; the process's other threads go on.
TEST_F(FailpointTest, AStallStopsOnlyTheThreadThatHitsIt) {
  ::setenv("BATON_FAILPOINTS", "first:stall,later:3:stall", 1);
  ReloadFailpointsForTesting();
  BATON_FAILPOINT("later");  // hit 1 of 3: passes ("name:stall" alone is hit 1, a stall)
  EXPECT_EQ(FailpointHits("later"), 1);
  EXPECT_EXIT(
      {
        ::setenv("BATON_FAILPOINTS", "generator_step:2:stall", 1);
        ReloadFailpointsForTesting();
        std::atomic<int> passed{0};
        std::thread compute([&] {
          for (int i = 0; i < 5; ++i) {
            BATON_FAILPOINT("generator_step");
            passed.fetch_add(1);
          }
        });
        compute.detach();
        while (FailpointHits("generator_step") < 2) std::this_thread::yield();
        // Unstalled, the other thread would pass its last three hits in microseconds.
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        std::exit(passed.load() == 1 ? 0 : 1);  // this thread goes on; the other stands at 2
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace baton
