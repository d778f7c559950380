// The one list of an engine command's placeholders (controller/engines/engine_placeholders.h):
// every name on it is filled in by a launch, any other {name} is refused with the list, and
// braces that are no placeholder (a shell's ${VAR}, JSON) pass.
#include "controller/engines/engine_placeholders.h"

#include <gtest/gtest.h>

#include "controller/engines/supervisor.h"

namespace baton {
namespace {

TEST(EnginePlaceholders, EveryNameOnTheListIsFilledInByALaunch) {
  std::vector<std::string> command = {"eng"};
  for (const std::string& name : EnginePlaceholders()) command.push_back("{" + name + "}");
  const Supervisor sup(command, "/run/c.sock", "/m", "/run", "");
  const std::vector<std::string> argv =
      sup.Expand({.engine_id = 7, .role = proto::LaunchRole::kStandby, .token = "tok", .port = 9});
  ASSERT_EQ(argv.size(), command.size());
  for (size_t i = 1; i < argv.size(); ++i) {
    EXPECT_EQ(argv[i].find('{'), std::string::npos) << command[i] << " is not filled in";
  }
  EXPECT_TRUE(CheckPlaceholders(command, "engine.command").ok());
}

TEST(EnginePlaceholders, AnUnknownOneIsRefusedNamingItAndTheKnownOnes) {
  const Status s =
      CheckPlaceholders({"eng", "--socket", "{socket}", "--x={bogus}"}, "engine.command");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "engine.command: unknown placeholder {bogus} in '--x={bogus}'; the placeholders are "
            "{socket} {token} {role} {engine_id} {host} {port} {model_dir} {runtime_dir}");
  EXPECT_FALSE(CheckPlaceholders({"eng", "{Socket}"}, "c").ok());  // names are case-sensitive
}

TEST(EnginePlaceholders, BracesThatAreNoPlaceholderPass) {
  for (const std::vector<std::string>& ok : std::vector<std::vector<std::string>>{
           {"sh", "-c", "exec eng --home ${HOME} --socket {socket}"},  // the shell's, and ours
           {"vllm", "--compilation-config", "{\"level\": 3}"},         // JSON
           {"eng", "--x", "{}", "{ socket }", "a{b", "}{"}}) {
    EXPECT_TRUE(CheckPlaceholders(ok, "engine.command").ok()) << ok.back();
  }
}

}  // namespace
}  // namespace baton
