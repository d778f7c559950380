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
  EXPECT_EQ(TomlNestingDepth("engine.command = [\"x\", \"--y=[1]\"]\n"), 2);
}

TEST(TomlDepth, DeepFilesAreMeasuredNotParsed) {
  const std::string deep = "a = " + std::string(100000, '[') + std::string(100000, ']') + "\n";
  EXPECT_EQ(TomlNestingDepth(deep), 100000);
  EXPECT_GT(TomlNestingDepth("x = " + std::string(10000, '{')), kMaxTomlDepth);
}

TEST(TomlDepth, CountsTheDotsOfKeys) {
  EXPECT_EQ(TomlNestingDepth("a.b.c = 1\n"), 2);
  EXPECT_EQ(TomlNestingDepth("[a.b.c]\nx = 1\n"), 3);
  EXPECT_EQ(TomlNestingDepth("[a.b]\nc.d = 1\n"), 3);  // the key line adds to its header
  EXPECT_EQ(TomlNestingDepth("[[a.b]]\n"), 3);
  EXPECT_EQ(TomlNestingDepth("x = {a.b = {c.d = 1}}\n"), 4);
  EXPECT_EQ(TomlNestingDepth("x = {a = 1, b.c.d = 2}\n"), 3);
  // A new header starts over; a key line under no header counts from zero.
  EXPECT_EQ(TomlNestingDepth("[a.b.c.d]\n[e]\nf.g = 1\n"), 4);
}

TEST(TomlDepth, IgnoresDotsOutsideKeys) {
  EXPECT_EQ(TomlNestingDepth("a = 1.5\nb = 1979-05-27T07:32:00.999\n"), 0);
  EXPECT_EQ(TomlNestingDepth("a = [1.5, 2.5e3]\n"), 1);
  EXPECT_EQ(TomlNestingDepth("a = {b = 1.5, c = 2.5}\n"), 1);
  EXPECT_EQ(TomlNestingDepth("\"a.b.c\" = 1\n'd.e.f' = 2\n"), 0);  // quoted keys
  EXPECT_EQ(TomlNestingDepth("a.\"b.c\".d = 1\n"), 2);
  EXPECT_EQ(TomlNestingDepth("a = \"x.y.z\" # p.q.r\n"), 0);
  EXPECT_EQ(TomlNestingDepth("a = [\n  1.5,\n  2.5,\n]\nb = 1\n"), 1);
}

TEST(TomlDepth, DeeplyDottedKeysAreRefused) {
  std::string key = "a";
  for (int i = 1; i < 100000; ++i) key += ".a";
  EXPECT_EQ(TomlNestingDepth(key + " = 1\n"), 99999);
  EXPECT_EQ(TomlNestingDepth("[" + key + "]\n"), 100000);
  const Status status = CheckTomlDepth("[" + key + "]\n", "x.toml");
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("x.toml: arrays, tables and dotted keys nested"),
            std::string::npos)
      << status.message();
  std::string edge = "a";
  for (int i = 0; i < kMaxTomlDepth; ++i) edge += ".a";
  EXPECT_TRUE(CheckTomlDepth(edge + " = 1\n", "x.toml").ok());
  EXPECT_FALSE(CheckTomlDepth(edge + ".a = 1\n", "x.toml").ok());
}

}  // namespace
}  // namespace baton
