#include "base/bug.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace baton {
namespace {

// Every test binary aborts on a bug (tests/support/test_main.cc); these tests set the mode
// they check and put it back.
class BugTest : public ::testing::Test {
 protected:
  void TearDown() override { SetAbortOnBug(true); }
};

TEST_F(BugTest, ABugIsCountedAndTheProgramGoesOnWhenNotAborting) {
  SetAbortOnBug(false);
  const uint64_t before = BugCount();
  BATON_BUG("test") << "the ledger refused grant " << 7;
  BATON_BUG("test") << "again";
  EXPECT_EQ(BugCount(), before + 2);
}

TEST_F(BugTest, ABugAbortsWhereTheProcessAskedForIt) {
  SetAbortOnBug(true);
  EXPECT_DEATH(BATON_BUG("ledger") << "engine " << 3 << " was never granted",
               "bug \\(ledger\\): engine 3 was never granted");
}

TEST_F(BugTest, TheTestBinariesAbortOnBugs) {
  EXPECT_TRUE(AbortOnBug());
  EXPECT_STREQ(std::getenv("BATON_ABORT_ON_BUG"), "1");  // the daemons a test starts, too
}

}  // namespace
}  // namespace baton
