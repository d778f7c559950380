#include "proto/http/engine_key.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace baton {
namespace {

constexpr char kKey[] = "0123456789abcdefABCDEF+/=";
constexpr char kOther[] = "zyxwvutsrqponmlk-._~";

class EngineKeyFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "baton-engine-key-" + std::to_string(::getpid());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& text, mode_t mode = 0600) {
    const std::string path = dir_ + "/engine.key";
    std::ofstream(path, std::ios::trunc) << text;
    ::chmod(path.c_str(), mode);
    return path;
  }

  std::string dir_;
};

TEST_F(EngineKeyFileTest, ReadsEveryKeyInOrderSkippingCommentsAndBlanks) {
  const std::string path =
      Write(std::string("# rotated 2026-12\n\n  ") + kKey + "  \r\n" + kOther + "\n");
  Result<std::vector<std::string>> keys = ReadEngineKeyFile(path);
  ASSERT_TRUE(keys.ok()) << keys.status().ToString();
  EXPECT_EQ(*keys, (std::vector<std::string>{kKey, kOther}));
}

TEST_F(EngineKeyFileTest, RefusesAFileOpenToEveryUser) {
  const std::string path = Write(kKey, 0644);
  Result<std::vector<std::string>> keys = ReadEngineKeyFile(path);
  ASSERT_FALSE(keys.ok());
  EXPECT_NE(keys.status().message().find("open to every user (mode 0644): chmod o-rw"),
            std::string::npos)
      << keys.status().message();
  EXPECT_TRUE(ReadEngineKeyFile(Write(kKey, 0640)).ok());
}

TEST_F(EngineKeyFileTest, NamesTheLineOfABadKeyWithoutTheKey) {
  const std::string shorter = "short-key";
  Result<std::vector<std::string>> keys =
      ReadEngineKeyFile(Write(std::string(kKey) + "\n# x\n" + shorter + "\n"));
  ASSERT_FALSE(keys.ok());
  EXPECT_NE(keys.status().message().find("line 3: a key of 9 characters"), std::string::npos)
      << keys.status().message();
  EXPECT_EQ(keys.status().message().find(shorter), std::string::npos);
  keys = ReadEngineKeyFile(Write(std::string(kKey) + std::string(1, '\0') + "tail\n"));
  ASSERT_FALSE(keys.ok()) << "a NUL byte would cut the variable an engine is given";
  EXPECT_NE(keys.status().message().find("a key with a character out of"), std::string::npos);
  keys = ReadEngineKeyFile(Write(std::string(kKey) + " with a space\n"));
  ASSERT_FALSE(keys.ok());
  EXPECT_NE(keys.status().message().find("line 1: a key with a character out of"),
            std::string::npos)
      << keys.status().message();
}

TEST_F(EngineKeyFileTest, RefusesAFileWithNoKeyOneMissingAndOneTooLong) {
  Result<std::vector<std::string>> keys = ReadEngineKeyFile(Write("# only a comment\n\n"));
  ASSERT_FALSE(keys.ok());
  EXPECT_NE(keys.status().message().find("holds no key"), std::string::npos);
  keys = ReadEngineKeyFile(dir_ + "/none.key");
  ASSERT_FALSE(keys.ok());
  EXPECT_NE(keys.status().message().find("No such file or directory (make one: openssl rand"),
            std::string::npos)
      << keys.status().message();
  keys = ReadEngineKeyFile(Write(std::string(kEngineKeyFileMaxBytes + 1, '#')));
  ASSERT_FALSE(keys.ok());
  EXPECT_NE(keys.status().message().find("is longer than"), std::string::npos);
  keys = ReadEngineKeyFile(dir_);
  ASSERT_FALSE(keys.ok());
  EXPECT_NE(keys.status().message().find("not a regular file"), std::string::npos);
  // A FIFO in the file's place is refused at once, not waited on for a writer.
  const std::string fifo = dir_ + "/fifo.key";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  keys = ReadEngineKeyFile(fifo);
  ASSERT_FALSE(keys.ok());
  EXPECT_NE(keys.status().message().find("not a regular file"), std::string::npos);
}

TEST(EngineKeys, ASettingIsAnAbsolutePathToAKeyFile) {
  EXPECT_NE(CheckEngineKeyFileSetting("engine.key_file", "engine.key")
                .message()
                .find("engine.key_file: want an absolute path"),
            std::string::npos);
  EXPECT_NE(CheckEngineKeyFileSetting("engine-key-file", "/nonexistent/engine.key")
                .message()
                .find("engine-key-file: engine key file /nonexistent/engine.key: No such file"),
            std::string::npos);
}

TEST(EngineKeys, TheVariableRoundTripsAndRefusesAnEmptyOrBadElement) {
  const std::vector<std::string> keys = {kKey, kOther};
  Result<std::vector<std::string>> parsed = ParseEngineKeys(JoinEngineKeys(keys));
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(*parsed, keys);
  EXPECT_TRUE(ParseEngineKeys("").ok());
  EXPECT_TRUE(ParseEngineKeys("")->empty());
  for (const std::string& bad : {std::string(kKey) + ",," + kOther, std::string(kKey) + ",",
                                 std::string("tooshort"), std::string(kKey) + ",a b"}) {
    Result<std::vector<std::string>> r = ParseEngineKeys(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("BATON_ENGINE_KEYS, element"), std::string::npos)
        << r.status().message();
  }
}

HttpRequest WithAuthorization(const std::string& value) {
  HttpRequest req;
  if (!value.empty()) req.set(boost::beast::http::field::authorization, value);
  return req;
}

TEST(EngineKeys, BearerMatchesAnyKeyWithTheSchemeInAnyCase) {
  const std::vector<std::string> keys = {kKey, kOther};
  EXPECT_TRUE(BearerMatches(WithAuthorization(std::string("Bearer ") + kKey), keys));
  EXPECT_TRUE(BearerMatches(WithAuthorization(std::string("bEaReR ") + kOther), keys));
  EXPECT_FALSE(BearerMatches(WithAuthorization(""), keys));
  EXPECT_FALSE(BearerMatches(WithAuthorization(kKey), keys));
  EXPECT_FALSE(BearerMatches(WithAuthorization(std::string("Basic ") + kKey), keys));
  EXPECT_FALSE(BearerMatches(WithAuthorization(std::string("Bearer ") + kKey + "x"), keys));
  EXPECT_FALSE(BearerMatches(WithAuthorization("Bearer "), keys));
  EXPECT_FALSE(BearerMatches(WithAuthorization("Bear"), keys));
  EXPECT_FALSE(BearerMatches(WithAuthorization(std::string("Bearer ") + kKey), {}));
}

}  // namespace
}  // namespace baton
