#include "base/check.h"

#include <gtest/gtest.h>

#include <string>

#include "base/status.h"

namespace baton {
namespace {

Result<int> Odd() { return InvalidArgument("odd: 3"); }

TEST(CheckDeathTest, AFailedCheckAbortsNamingItsConditionAndContext) {
  const int blocks = 3;
  EXPECT_DEATH(BATON_CHECK(blocks == 4) << "engine " << 7 << " holds " << blocks,
               "check_test.cc:[0-9]+: check failed: blocks == 4: engine 7 holds 3");
}

TEST(CheckDeathTest, AHeldCheckGoesOnAndEvaluatesItsConditionOnce) {
  int evaluated = 0;
  BATON_CHECK(++evaluated == 1) << "never printed";
  EXPECT_EQ(evaluated, 1);
}

TEST(CheckDeathTest, ACheckIsOneStatementUnderAnIf) {
  bool reached = false;
  if (reached)
    BATON_CHECK(false) << "not reached";
  else
    reached = true;
  EXPECT_TRUE(reached);
}

TEST(CheckDeathTest, ADebugCheckRunsOnlyWithoutNdebug) {
  int evaluated = 0;
  BATON_DCHECK(++evaluated > 0);
#ifdef NDEBUG
  EXPECT_EQ(evaluated, 0) << "compiled, not evaluated";
#else
  EXPECT_EQ(evaluated, 1);
  EXPECT_DEATH(BATON_DCHECK(evaluated == 2), "check failed: evaluated == 2");
#endif
}

TEST(CheckDeathTest, TheValueOfAnErrorAbortsNamingTheError) {
  EXPECT_DEATH((void)Odd().value(), "Result::value\\(\\) taken of an error: .*odd: 3");
  EXPECT_DEATH((void)*Odd(), "taken of an error");
  const Result<std::string> missing = NotFound("no such engine");
  EXPECT_DEATH((void)missing->size(), "no such engine");
}

TEST(CheckDeathTest, TheValueOfAValueIsTheValue) {
  Result<std::string> r = std::string("kept");
  EXPECT_EQ(r.value(), "kept");
  EXPECT_EQ(r->size(), 4u);
  EXPECT_EQ(std::move(r).value(), "kept");
}

}  // namespace
}  // namespace baton
