// `baton-controller --check-config` on what a start would find on this machine: the engine
// program as a launch resolves it (placeholders expanded, then PATH), and the NUMA node the
// weights would be bound to.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "tests/chaos/chaos_harness.h"
#include "tests/deploy/deploy_support.h"

namespace baton::deploy_test {
namespace {

ProgramRun Check(const std::vector<std::string>& flags) {
  std::vector<std::string> argv = {BinDir() + "/baton-controller", "--check-config", "--model",
                                   chaos::TinyModelDir()};
  argv.insert(argv.end(), flags.begin(), flags.end());
  return RunProgram(argv);
}

constexpr char kEngineWarning[] = "warning: engine.command: ";

TEST(CheckConfig, TheEngineProgramIsResolvedAsALaunchResolvesIt) {
  // Not on PATH: a launch would fail; a program without '/' was not looked at.
  ProgramRun run = Check({"--engine-cmd", "baton-no-such-engine --x"});
  EXPECT_EQ(run.code, 0) << run.output;
  EXPECT_NE(run.output.find(std::string(kEngineWarning) +
                            "engine command 'baton-no-such-engine' is not on PATH: no engine "
                            "would start"),
            std::string::npos)
      << run.output;
  run = Check({"--engine-cmd", "true"});  // on PATH
  EXPECT_EQ(run.code, 0) << run.output;
  EXPECT_EQ(run.output.find(kEngineWarning), std::string::npos) << run.output;

  // A placeholder is expanded first: {runtime_dir}/engine was said not to be executable.
  const std::string dir = ScratchDir("check-engine");
  const std::string engine = dir + "/engine";
  WriteFile(engine, "#!/bin/sh\nexit 0\n");
  std::filesystem::permissions(engine, std::filesystem::perms::owner_all);
  run = Check({"--engine-cmd", "{runtime_dir}/engine --port {port}", "--runtime-dir", dir});
  EXPECT_EQ(run.code, 0) << run.output;
  EXPECT_EQ(run.output.find(kEngineWarning), std::string::npos) << run.output;
  std::filesystem::permissions(
      engine, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  run = Check({"--engine-cmd", "{runtime_dir}/engine", "--runtime-dir", dir});
  EXPECT_EQ(run.code, 0) << run.output;
  EXPECT_NE(run.output.find(std::string(kEngineWarning) + "engine program " + engine),
            std::string::npos)
      << run.output;
  std::filesystem::remove_all(dir);
}

// A node that is not online here: a start would fail binding the weights (exit 1, the key
// unnamed); the check and the start name the key (exit 2).
TEST(CheckConfig, ANumaNodeNotOnlineIsNamed) {
  const ProgramRun run = Check({"--engine-cmd", "true", "--numa-node", "1023"});
  EXPECT_EQ(run.code, 2) << run.output;
  EXPECT_NE(run.output.find("baton-controller: model.numa_node: node 1023 is not online here "
                            "(online nodes: "),
            std::string::npos)
      << run.output;
}

}  // namespace
}  // namespace baton::deploy_test
