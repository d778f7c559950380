#include "base/io/unique_fd.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

namespace baton {
namespace {

bool IsOpen(int fd) { return ::fcntl(fd, F_GETFD) != -1; }

TEST(UniqueFdTest, ClosesOnDestruction) {
  int raw = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(raw, 0);
  {
    UniqueFd fd(raw);
    EXPECT_TRUE(fd.valid());
  }
  EXPECT_FALSE(IsOpen(raw));
}

TEST(UniqueFdTest, MoveTransfersOwnership) {
  int raw = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  UniqueFd a(raw);
  UniqueFd b(std::move(a));
  EXPECT_FALSE(a.valid());  // NOLINT(bugprone-use-after-move): moved-from state is specified
  EXPECT_EQ(b.get(), raw);
  UniqueFd c;
  c = std::move(b);
  EXPECT_EQ(c.get(), raw);
  EXPECT_TRUE(IsOpen(raw));
}

TEST(UniqueFdTest, ReleaseKeepsFdOpen) {
  int raw = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  int released;
  {
    UniqueFd fd(raw);
    released = fd.Release();
  }
  EXPECT_TRUE(IsOpen(released));
  ::close(released);
}

TEST(UniqueFdTest, ResetClosesPrevious) {
  int a = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  int b = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  UniqueFd fd(a);
  fd.Reset(b);
  EXPECT_FALSE(IsOpen(a));
  EXPECT_EQ(fd.get(), b);
}

}  // namespace
}  // namespace baton
