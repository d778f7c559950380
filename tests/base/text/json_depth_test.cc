#include "base/text/json_depth.h"

#include <gtest/gtest.h>

#include <string>

namespace baton {
namespace {

TEST(JsonDepth, CountsNestedContainers) {
  EXPECT_EQ(JsonNestingDepth("1"), 0);
  EXPECT_EQ(JsonNestingDepth("{}"), 1);
  EXPECT_EQ(JsonNestingDepth(R"({"a":[1,{"b":[]}],"c":{}})"), 4);
}

TEST(JsonDepth, IgnoresBracketsInStrings) {
  EXPECT_EQ(JsonNestingDepth(R"({"a":"[[[[{{{{"})"), 1);
  EXPECT_EQ(JsonNestingDepth(R"({"a":"\"[[[","b":[]})"), 2);
  EXPECT_EQ(JsonNestingDepth(R"(["\\",[]])"), 2);
}

TEST(JsonDepth, DeepBodiesAreMeasuredNotParsed) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  EXPECT_EQ(JsonNestingDepth(deep), 100000);
  EXPECT_GT(JsonNestingDepth(deep), kMaxJsonDepth);
}

}  // namespace
}  // namespace baton
