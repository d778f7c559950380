#include "base/text/utf8.h"

#include <gtest/gtest.h>

namespace baton {
namespace {

TEST(Utf8Test, AcceptsValidText) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("/opt/engine --name caf\xC3\xA9"));
  EXPECT_TRUE(IsValidUtf8("\xE2\x82\xAC \xF0\x9F\x98\x80 \xF4\x8F\xBF\xBF"));
}

TEST(Utf8Test, NamesTheFirstBadByte) {
  EXPECT_EQ(FirstInvalidUtf8("caf\xE9"), 3u);             // Latin-1
  EXPECT_EQ(FirstInvalidUtf8("ab\xC3"), 2u);              // cut short
  EXPECT_EQ(FirstInvalidUtf8("\xC0\xAF"), 0u);            // overlong
  EXPECT_EQ(FirstInvalidUtf8("x\xE0\x80\xAF"), 1u);       // overlong
  EXPECT_EQ(FirstInvalidUtf8("\xED\xA0\x80"), 0u);        // a surrogate
  EXPECT_EQ(FirstInvalidUtf8("ok\xF4\x90\x80\x80"), 2u);  // past U+10FFFF
  EXPECT_EQ(FirstInvalidUtf8("\xE2\x82\xAC\x80"), 3u);    // a lone continuation byte
}

}  // namespace
}  // namespace baton
