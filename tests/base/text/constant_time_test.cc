#include "base/text/constant_time.h"

#include <gtest/gtest.h>

#include <string>

namespace baton {
namespace {

TEST(ConstantTimeEquals, EqualOnlyWhenEveryByteAndTheLengthAgree) {
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_TRUE(ConstantTimeEquals("0123456789abcdef", "0123456789abcdef"));
  EXPECT_FALSE(ConstantTimeEquals("0123456789abcdef", "0123456789abcdeF"));  // the last byte
  EXPECT_FALSE(ConstantTimeEquals("0123456789abcdef", "x123456789abcdef"));  // the first
  EXPECT_FALSE(ConstantTimeEquals("0123456789abcdef", "0123456789abcde"));
  EXPECT_FALSE(ConstantTimeEquals("", "a"));
  const std::string with_nul("a\0b", 3);
  EXPECT_FALSE(ConstantTimeEquals(with_nul, std::string("a\0c", 3)));
  EXPECT_TRUE(ConstantTimeEquals(with_nul, std::string("a\0b", 3)));
}

}  // namespace
}  // namespace baton
