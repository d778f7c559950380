// ProcessesHolding: a forked child that maps a memfd, and one that only keeps it open, are
// found; one that closed it is not, nor an excluded pid, nor a file nobody holds.
#include "base/process/file_holders.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#include "base/io/unique_fd.h"

namespace baton {
namespace {

enum class Hold { kMap, kOpen, kNothing };

// A child that holds `fd` as told and waits to be killed; its pid once it holds it.
pid_t StartHolder(int fd, Hold hold) {
  int ready[2];
  if (::pipe(ready) != 0) return -1;
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(ready[0]);
    if (hold == Hold::kMap) {
      void* p = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED) ::_exit(1);
      ::close(fd);  // held by the mapping alone
    } else if (hold == Hold::kNothing) {
      ::close(fd);
    }
    (void)!::write(ready[1], "x", 1);
    while (true) ::pause();
  }
  ::close(ready[1]);
  char c = 0;
  const bool held = ::read(ready[0], &c, 1) == 1;
  ::close(ready[0]);
  return held ? child : -1;
}

void Stop(pid_t pid) {
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
}

// Every holder started is stopped, whichever way the test ends.
struct Children {
  std::vector<pid_t> pids;
  ~Children() {
    for (pid_t pid : pids) {
      if (pid > 0) Stop(pid);
    }
  }
  pid_t Add(pid_t pid) {
    pids.push_back(pid);
    return pid;
  }
};

bool Has(const std::vector<pid_t>& pids, pid_t pid) {
  return std::find(pids.begin(), pids.end(), pid) != pids.end();
}

TEST(FileHolders, FindsWhoMapsOrHoldsAFileAndNoOneElse) {
  UniqueFd fd(::memfd_create("baton-holders-test", MFD_CLOEXEC));
  ASSERT_TRUE(fd.valid());
  ASSERT_EQ(::ftruncate(fd.get(), 4096), 0);
  const FileId id = FileIdOf(fd.get());
  ASSERT_NE(id.ino, 0u);

  Children children;
  const pid_t mapper = children.Add(StartHolder(fd.get(), Hold::kMap));
  const pid_t opener = children.Add(StartHolder(fd.get(), Hold::kOpen));
  const pid_t none = children.Add(StartHolder(fd.get(), Hold::kNothing));
  ASSERT_GT(mapper, 0);
  ASSERT_GT(opener, 0);
  ASSERT_GT(none, 0);

  const pid_t self = ::getpid();
  const std::vector<FileId> files = {id};
  const std::vector<pid_t> found = ProcessesHolding(files, std::vector<pid_t>{self});
  EXPECT_TRUE(Has(found, mapper)) << "a mapping alone holds it";
  EXPECT_TRUE(Has(found, opener)) << "an open fd alone holds it";
  EXPECT_FALSE(Has(found, none));
  EXPECT_FALSE(Has(found, self)) << "excluded";
  EXPECT_TRUE(HoldsAnyOf(self, files));

  UniqueFd other(::memfd_create("baton-holders-other", MFD_CLOEXEC));  // after the forks
  ASSERT_TRUE(other.valid());
  const std::vector<FileId> nobody = {FileIdOf(other.get())};
  EXPECT_EQ(ProcessesHolding(nobody, std::vector<pid_t>{self}).size(), 0u);

  ::kill(mapper, SIGKILL);
  ::waitpid(mapper, nullptr, 0);
  EXPECT_FALSE(Has(ProcessesHolding(files, std::vector<pid_t>{self}), mapper)) << "gone";
}

}  // namespace
}  // namespace baton
