#include "base/io/file_lock.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace baton {
namespace {

class FileLockTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/baton-file-lock-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/controller.lock";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string dir_;
  std::string path_;
};

TEST_F(FileLockTest, ASecondHolderIsRefusedWithTheFirstOnesPidUntilItLetsGo) {
  Result<UniqueFd> first = LockFile(path_, "runtime directory " + dir_);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  std::string written;
  std::getline(std::ifstream(path_), written);
  EXPECT_EQ(written, std::to_string(::getpid()));

  Result<UniqueFd> second = LockFile(path_, "runtime directory " + dir_);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(second.status().message(), "runtime directory " + dir_ +
                                           " is in use by another process (pid " +
                                           std::to_string(::getpid()) + " holds " + path_ + ")");

  first->Reset();
  Result<UniqueFd> third = LockFile(path_, "runtime directory " + dir_);
  EXPECT_TRUE(third.ok()) << third.status().ToString();
}

// Engines outlive their controller: a program the holder started must not keep the lock.
TEST_F(FileLockTest, AProgramTheHolderStartsDoesNotInheritTheLock) {
  Result<UniqueFd> held = LockFile(path_, "the lock");
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  pid_t child = 0;
  char sleep_bin[] = "/bin/sleep";
  char seconds[] = "30";
  char* argv[] = {sleep_bin, seconds, nullptr};
  ASSERT_EQ(::posix_spawn(&child, sleep_bin, nullptr, nullptr, argv, environ), 0);
  held->Reset();  // the holder goes; its child runs on
  Result<UniqueFd> next = LockFile(path_, "the lock");
  EXPECT_TRUE(next.ok()) << next.status().ToString();
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
}

TEST_F(FileLockTest, AFileThatCannotBeOpenedSaysSo) {
  Result<UniqueFd> lock = LockFile(dir_ + "/missing/controller.lock", "the lock");
  ASSERT_FALSE(lock.ok());
  EXPECT_NE(lock.status().message().find("open lock file " + dir_ + "/missing/controller.lock"),
            std::string::npos)
      << lock.status().ToString();
}

// Another user who could write to the runtime directory must not make the controller
// overwrite a file of theirs choosing with its pid.
TEST_F(FileLockTest, ASymbolicLinkIsRefusedNotFollowed) {
  const std::string victim = dir_ + "/victim";
  std::ofstream(victim) << "precious\n";
  ASSERT_EQ(::symlink(victim.c_str(), path_.c_str()), 0);
  Result<UniqueFd> lock = LockFile(path_, "the lock");
  ASSERT_FALSE(lock.ok());
  EXPECT_EQ(lock.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(lock.status().message().find("open lock file " + path_ + " is a symbolic link"),
            std::string::npos)
      << lock.status().ToString();
  std::string kept;
  std::getline(std::ifstream(victim), kept);
  EXPECT_EQ(kept, "precious");
}

}  // namespace
}  // namespace baton
