#include "base/build_info.h"

#include <gtest/gtest.h>

#include <regex>
#include <string>
#include <vector>

namespace baton {
namespace {

TEST(BuildInfo, VersionLineNamesTheProgramVersionCommitAndBuildType) {
  const BuildInfo& info = GetBuildInfo();
  EXPECT_FALSE(info.version.empty());
  EXPECT_FALSE(info.commit.empty());
  const std::string line = VersionLine("baton-x");
  EXPECT_TRUE(std::regex_match(line, std::regex(R"(baton-x \d+\.\d+\.\d+ \(commit \S+, \S+\))")))
      << line;
  EXPECT_NE(line.find(std::string(info.commit)), std::string::npos) << line;
}

TEST(BuildInfo, WantsVersionOnlyBeforeADoubleDash) {
  auto wants = [](std::vector<std::string> args) {
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    return WantsVersion(static_cast<int>(argv.size()), argv.data());
  };
  EXPECT_TRUE(wants({"prog", "--version"}));
  EXPECT_TRUE(wants({"prog", "--json", "--version"}));
  EXPECT_FALSE(wants({"prog"}));
  EXPECT_FALSE(wants({"prog", "upgrade", "--", "engine", "--version"}));  // the engine's flag
}

TEST(BuildInfo, MetricsAreOneGaugeEachWithTheLabels) {
  const std::string text = ProcessInfoMetrics("baton-x");
  const BuildInfo& info = GetBuildInfo();
  EXPECT_NE(text.find("# TYPE baton_build_info gauge"), std::string::npos) << text;
  EXPECT_NE(text.find("program=\"baton-x\""), std::string::npos) << text;
  EXPECT_NE(text.find("commit=\"" + std::string(info.commit) + "\""), std::string::npos) << text;
  EXPECT_TRUE(std::regex_search(text, std::regex(R"(\nprocess_start_time_seconds \d{10})")))
      << text;
}

}  // namespace
}  // namespace baton
