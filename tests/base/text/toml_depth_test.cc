#include "base/text/toml_depth.h"

#include <gtest/gtest.h>

#include <string>

namespace baton {
namespace {

TEST(TomlDepth, CountsArraysInlineTablesAndHeaders) {
  EXPECT_EQ(TomlNestingDepth("a = 1\n"), 0);
  EXPECT_EQ(TomlNestingDepth("[pool]\nblocks = 8\n"), 1);
  EXPECT_EQ(TomlNestingDepth("[[x]]\n"), 2);
  EXPECT_EQ(TomlNestingDepth("a = [1, {b = [2]}]\n"), 3);
}

TEST(TomlDepth, IgnoresBracketsInStringsAndComments) {
  EXPECT_EQ(TomlNestingDepth("a = \"[[[{{\"\n"), 0);
  EXPECT_EQ(TomlNestingDepth("a = \"\\\"[[[\" # [[[[\nb = []\n"), 1);
  EXPECT_EQ(TomlNestingDepth("a = '[[[\\'\nb = []\n"), 1);  // a literal string has no escapes
  EXPECT_EQ(TomlNestingDepth("a = \"\"\"\n[[[\n\"\"\"\nb = [[]]\n"), 2);
  EXPECT_EQ(TomlNestingDepth("a = '''\n{{{ ' '' \n'''\n"), 0);
  EXPECT_EQ(TomlNestingDepth("engine.command = [\"x\", \"--y=[1]\"]\n"), 1);
}

TEST(TomlDepth, DeepFilesAreMeasuredNotParsed) {
  const std::string deep = "a = " + std::string(100000, '[') + std::string(100000, ']') + "\n";
  EXPECT_EQ(TomlNestingDepth(deep), 100000);
  EXPECT_GT(TomlNestingDepth("x = " + std::string(10000, '{')), kMaxTomlDepth);
}

}  // namespace
}  // namespace baton
