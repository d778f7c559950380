// Which programs a fleet rollout may make a node run (controller/rollout/rollout_programs.h):
// the engine command's own program by default, exact programs and directories of
// fleet.rollout_programs, compared where they really are, so that ".." and symlinks do not
// lead out of a listed directory; anything else is refused, naming the program and the key.
#include "controller/rollout/rollout_programs.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace baton {
namespace {

class RolloutPrograms : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/baton-rollout-programs-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    std::filesystem::create_directories(dir_ + "/engines/v2");
    std::filesystem::create_directories(dir_ + "/elsewhere");
    for (const char* p :
         {"/engines/engine-v1", "/engines/v2/engine", "/elsewhere/tool", "/baton-refengine"}) {
      std::ofstream(dir_ + p) << "#!/bin/sh\n";
      ::chmod((dir_ + p).c_str(), 0755);
    }
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  Status Check(const std::string& program, const std::vector<std::string>& allowed) const {
    return CheckRolloutProgram(program, dir_ + "/baton-refengine", allowed);
  }

  std::string dir_;
};

TEST_F(RolloutPrograms, TheEngineCommandsOwnProgramIsAllowedWithAnEmptyList) {
  EXPECT_TRUE(Check(dir_ + "/baton-refengine", {}).ok());
  EXPECT_TRUE(Check(dir_ + "/engines/../baton-refengine", {}).ok()) << "compared canonical";
}

TEST_F(RolloutPrograms, ANonListedProgramIsRefusedNamingItAndTheKey) {
  const Status s = Check("/bin/sh", {});
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("/bin/sh"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("fleet.rollout_programs (empty)"), std::string::npos) << s.message();
  EXPECT_FALSE(Check(dir_ + "/elsewhere/tool", {dir_ + "/engines/"}).ok());
  // Nothing allows everything by default: the engine program that does not resolve allows
  // nothing either.
  EXPECT_FALSE(CheckRolloutProgram(dir_ + "/elsewhere/tool", "", {}).ok());
  EXPECT_FALSE(CheckRolloutProgram("/nonexistent/engine", "/nonexistent/engine", {}).ok());
}

TEST_F(RolloutPrograms, AnExactEntryAllowsThatProgramOnly) {
  EXPECT_TRUE(Check(dir_ + "/elsewhere/tool", {dir_ + "/elsewhere/tool"}).ok());
  EXPECT_FALSE(Check(dir_ + "/engines/engine-v1", {dir_ + "/elsewhere/tool"}).ok());
  // Without the trailing '/', a directory is an exact entry: it allows no program in it.
  EXPECT_FALSE(Check(dir_ + "/engines/engine-v1", {dir_ + "/engines"}).ok());
}

TEST_F(RolloutPrograms, ADirectoryEntryAllowsEveryProgramUnderIt) {
  const std::vector<std::string> allowed = {dir_ + "/engines/"};
  EXPECT_TRUE(Check(dir_ + "/engines/engine-v1", allowed).ok());
  EXPECT_TRUE(Check(dir_ + "/engines/v2/engine", allowed).ok());
  EXPECT_TRUE(Check(dir_ + "/engines/./v2/../engine-v1", allowed).ok());
  // A directory whose name only starts like the entry's is not under it.
  std::filesystem::create_directories(dir_ + "/engines-evil");
  std::ofstream(dir_ + "/engines-evil/x") << "#!/bin/sh\n";
  EXPECT_FALSE(Check(dir_ + "/engines-evil/x", allowed).ok());
}

TEST_F(RolloutPrograms, DotDotCannotLeaveAListedDirectory) {
  const Status s = Check(dir_ + "/engines/../elsewhere/tool", {dir_ + "/engines/"});
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("(" + dir_ + "/elsewhere/tool)"), std::string::npos)
      << "the real path is named: " << s.message();
  EXPECT_FALSE(Check(dir_ + "/engines/../../../../bin/sh", {dir_ + "/engines/"}).ok());
}

TEST_F(RolloutPrograms, ASymlinkInAListedDirectoryIsJudgedWhereItPoints) {
  ASSERT_EQ(::symlink("/bin/sh", (dir_ + "/engines/sh").c_str()), 0);
  ASSERT_EQ(::symlink((dir_ + "/elsewhere").c_str(), (dir_ + "/engines/out").c_str()), 0);
  const std::vector<std::string> allowed = {dir_ + "/engines/"};
  EXPECT_FALSE(Check(dir_ + "/engines/sh", allowed).ok());
  EXPECT_FALSE(Check(dir_ + "/engines/out/tool", allowed).ok());
  // A symlink to a listed program is that program.
  ASSERT_EQ(::symlink((dir_ + "/engines/engine-v1").c_str(), (dir_ + "/current").c_str()), 0);
  EXPECT_TRUE(Check(dir_ + "/current", allowed).ok());
  // A listed directory reached through a symlink is where it points.
  ASSERT_EQ(::symlink((dir_ + "/engines").c_str(), (dir_ + "/engines-link").c_str()), 0);
  EXPECT_TRUE(Check(dir_ + "/engines/v2/engine", {dir_ + "/engines-link/"}).ok());
  EXPECT_FALSE(Check(dir_ + "/elsewhere/tool", {dir_ + "/engines-link/"}).ok());
}

// An engine command that starts with env, a shell or an interpreter would let a rollout run
// anything through it ("env sh -c ..."): its program is not allowed by default, only listed.
TEST_F(RolloutPrograms, ALauncherEngineProgramIsAllowedOnlyWhenListed) {
  for (const char* name : {"/env", "/python3.11"}) {
    std::ofstream(dir_ + name) << "#!/bin/sh\n";
    ::chmod((dir_ + name).c_str(), 0755);
    const std::string launcher = dir_ + name;
    const Status s = CheckRolloutProgram(launcher, launcher, {});
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << name;
    EXPECT_NE(s.message().find("runs whatever its arguments name"), std::string::npos)
        << s.message();
    EXPECT_TRUE(CheckRolloutProgram(launcher, launcher, {launcher}).ok()) << name;
  }
}

TEST(RunsItsArguments, LaunchersShellsAndInterpretersByFileName) {
  for (const char* p : {"/usr/bin/env", "/usr/bin/dash", "/bin/bash", "/usr/bin/python3.11",
                        "/usr/bin/perl5.36", "/usr/bin/nice", "/usr/bin/taskset", "numactl"}) {
    EXPECT_TRUE(RunsItsArguments(p)) << p;
  }
  for (const char* p : {"/usr/bin/baton-refengine", "/opt/engines/baton-torch-engine",
                        "/usr/local/bin/vllm", "/usr/bin/envoy-engine", "/usr/bin/shengine"}) {
    EXPECT_FALSE(RunsItsArguments(p)) << p;
  }
}

}  // namespace
}  // namespace baton
