// EnsurePrivateDir / CheckPrivateDir: a runtime or state directory is used only when it is a
// real directory of the right owner that group and others cannot write to. The tests that
// need another user's directory chown one to uid 65534 and run as root only; the rest pass
// as any user.
#include "base/io/private_dir.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <utility>

namespace baton {
namespace {

constexpr uid_t kNobody = 65534;

class PrivateDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/baton-private-dir-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  Status Ensure(const std::string& path) {
    return EnsurePrivateDir(path, "runtime directory", "controller.runtime_dir");
  }
  Status Check(const std::string& path, DirOwner owner) {
    return CheckPrivateDir(path, owner, "runtime directory", "controller.runtime_dir");
  }
  static mode_t ModeOf(const std::string& path) {
    struct stat st {};
    EXPECT_EQ(::lstat(path.c_str(), &st), 0) << path;
    return st.st_mode & 07777;
  }
  static bool Has(const Status& s, const std::string& text) {
    return s.message().find(text) != std::string::npos;
  }

  std::string dir_;  // mkdtemp's: ours, mode 0700
};

TEST_F(PrivateDirTest, AnOwnDirectoryOfMode0700IsAccepted) {
  EXPECT_TRUE(Ensure(dir_).ok()) << Ensure(dir_).ToString();
  EXPECT_TRUE(Check(dir_, DirOwner::kSelf).ok());
  EXPECT_TRUE(Check(dir_, DirOwner::kSelfOrRoot).ok());
  EXPECT_TRUE(Check(dir_ + "/", DirOwner::kSelf).ok());
  EXPECT_EQ(ModeOf(dir_), 0700u) << "left as it was";
}

TEST_F(PrivateDirTest, AMissingDirectoryIsMadeWithMode0700WhateverTheUmask) {
  const std::string path = dir_ + "/a/b/run";
  const mode_t before = ::umask(0);
  const Status made = Ensure(path);
  ::umask(before);
  ASSERT_TRUE(made.ok()) << made.ToString();
  EXPECT_EQ(ModeOf(path), 0700u);
  EXPECT_TRUE(Ensure(path).ok()) << "an existing one is fine";
}

// systemd's RuntimeDirectoryMode=0750: the group may read, not write.
TEST_F(PrivateDirTest, GroupAndOthersMayReadButNotWrite) {
  for (mode_t ok : {0750u, 0755u, 0700u}) {
    ASSERT_EQ(::chmod(dir_.c_str(), ok), 0);
    EXPECT_TRUE(Ensure(dir_).ok()) << std::oct << ok << ": " << Ensure(dir_).ToString();
    EXPECT_EQ(ModeOf(dir_), ok) << "its mode is not changed";
  }
  const std::pair<mode_t, std::string> refused_modes[] = {
      {0770u, "0770"}, {0702u, "0702"}, {0777u, "0777"}, {01777u, "1777"}};
  for (const auto& [refused, text] : refused_modes) {
    ASSERT_EQ(::chmod(dir_.c_str(), refused), 0);
    const Status s = Ensure(dir_);
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << text;
    EXPECT_TRUE(Has(s, "runtime directory " + dir_ + " has mode " + text)) << s.ToString();
    EXPECT_TRUE(Has(s, "group or others can write to it")) << s.ToString();
    EXPECT_TRUE(Has(s, "set controller.runtime_dir")) << s.ToString();
    EXPECT_FALSE(Check(dir_, DirOwner::kSelfOrRoot).ok());
  }
  ::chmod(dir_.c_str(), 0700);
}

TEST_F(PrivateDirTest, ASymbolicLinkToADirectoryIsRefusedNotFollowed) {
  const std::string real = dir_ + "/real";
  const std::string link = dir_ + "/run";
  ASSERT_EQ(::mkdir(real.c_str(), 0700), 0);
  ASSERT_EQ(::symlink(real.c_str(), link.c_str()), 0);
  for (const std::string& path : {link, link + "/"}) {
    const Status s = Ensure(path);
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
    EXPECT_TRUE(Has(s, "runtime directory " + path + " is a symbolic link")) << s.ToString();
    EXPECT_FALSE(Check(path, DirOwner::kSelfOrRoot).ok());
  }
}

TEST_F(PrivateDirTest, AFileIsNotADirectory) {
  const std::string file = dir_ + "/run";
  ASSERT_EQ(::close(::creat(file.c_str(), 0600)), 0);
  const Status s = Ensure(file);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Has(s, "is not a directory")) << s.ToString();
}

TEST_F(PrivateDirTest, AMissingDirectoryIsNotFoundForAClient) {
  EXPECT_EQ(Check(dir_ + "/none", DirOwner::kSelfOrRoot).code(), StatusCode::kNotFound);
}

// Root's directories ("/") are a client's as well; the daemon wants its own.
TEST_F(PrivateDirTest, AClientAcceptsRootsDirectoryTheDaemonOnlyItsOwn) {
  EXPECT_TRUE(Check("/", DirOwner::kSelfOrRoot).ok())
      << Check("/", DirOwner::kSelfOrRoot).ToString();
  if (::geteuid() == 0) GTEST_SKIP() << "\"/\" is root's own";
  const Status s = Check("/", DirOwner::kSelf);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Has(s, "is owned by uid 0 (mode 0755), not by this user")) << s.ToString();
}

// The attack: another user made /tmp/baton-<uid> first.
TEST_F(PrivateDirTest, AnotherUsersDirectoryIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to chown a directory to another user";
  const std::string run = dir_ + "/run";
  ASSERT_EQ(::mkdir(run.c_str(), 0700), 0);
  ASSERT_EQ(::chown(run.c_str(), kNobody, kNobody), 0);
  const Status s = Ensure(run);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Has(s, "runtime directory " + run +
                         " is owned by uid 65534 (mode 0700), not by "
                         "this user (uid 0)"))
      << s.ToString();
  EXPECT_TRUE(Has(s, "remove it, or set controller.runtime_dir")) << s.ToString();

  // A client running as root: in a parent only root can write to (systemd's /run/baton,
  // owned by the service user), root made it; in one all can write to (/tmp), anyone did.
  EXPECT_TRUE(Check(run, DirOwner::kSelfOrRoot).ok())
      << Check(run, DirOwner::kSelfOrRoot).ToString();
  ASSERT_EQ(::chmod(dir_.c_str(), 01777), 0);
  const Status in_tmp = Check(run, DirOwner::kSelfOrRoot);
  EXPECT_EQ(in_tmp.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Has(in_tmp, "not by this user (uid 0) nor made by root")) << in_tmp.ToString();
  ::chmod(dir_.c_str(), 0700);
}

TEST_F(PrivateDirTest, ASymbolicLinkIsNotFollowedWhereAFileIsOpened) {
  const std::string victim = dir_ + "/victim";
  const std::string link = dir_ + "/file";
  ASSERT_EQ(::symlink(victim.c_str(), link.c_str()), 0);
  const int fd = ::open(link.c_str(), O_WRONLY | O_CREAT | kPrivateFileFlags, 0600);
  ASSERT_LT(fd, 0);
  const Status s = PrivateFileOpenError("open roster", link, errno);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Has(s, "open roster " + link + " is a symbolic link: not followed")) << s.ToString();
  EXPECT_FALSE(std::filesystem::exists(victim));
}

}  // namespace
}  // namespace baton
