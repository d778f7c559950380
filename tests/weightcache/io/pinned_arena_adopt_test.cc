// PinnedArena::Adopt: a new controller maps the weight arena an earlier one left in a memfd.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>

#include "tests/weightcache/io/pinned_arena_testutil.h"
#include "weightcache/io/pinned_arena.h"

namespace baton {
namespace {

using arena_testing::AnyWarningContains;
using arena_testing::DropIpcLock;
using arena_testing::HugePagesFree;

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kRealMlock = false;  // the sanitizers replace mlock with a no-op
#else
constexpr bool kRealMlock = true;
#endif

// A memfd as an earlier controller left it: filled with a pattern and sealed as `sealing` says.
SharedMemory FilledMemfd(size_t size, bool huge_pages, std::optional<Sealing> sealing) {
  auto shm = SharedMemory::Create({"adopt-test", size, huge_pages});
  EXPECT_TRUE(shm.ok()) << shm.status().ToString();
  {
    auto map = shm->Map(Protection::kReadWrite);
    EXPECT_TRUE(map.ok());
    for (size_t i = 0; i < size; i += 4096) map->data()[i] = static_cast<uint8_t>(i / 4096 + 1);
  }
  if (sealing) {
    EXPECT_TRUE(shm->Seal(*sealing).ok());
  }
  return std::move(shm).value();
}

ArenaRecord RecordFor(const SharedMemory& shm) {
  struct stat st {};
  EXPECT_EQ(::fstat(shm.fd(), &st), 0);
  return ArenaRecord{.size = shm.size(),
                     .inode = st.st_ino,
                     .device = st.st_dev,
                     .huge_pages = shm.huge_pages(),
                     .numa_node = 3,
                     .numa_bound = true,
                     .numa_source = "gpu 0000:17:00.0",
                     .sealed_read_only = true};
}

// Kilobytes of the mapping at `addr` that have page-table entries now (smaps Rss).
long MappedKb(const void* addr) {
  std::ifstream in("/proc/self/smaps");
  std::string line;
  bool ours = false;
  while (std::getline(in, line)) {
    unsigned long start = 0;
    if (std::sscanf(line.c_str(), "%lx-", &start) == 1 && line.find(' ') != std::string::npos &&
        line.find('-') < line.find(' ')) {
      ours = start == reinterpret_cast<uintptr_t>(addr);
    } else if (ours && line.rfind("Rss:", 0) == 0) {
      return std::strtol(line.c_str() + 4, nullptr, 10);
    }
  }
  return -1;
}

TEST(PinnedArenaAdoptTest, MapsReadOnlyWithoutFaultingAndKeepsTheRecord) {
  const size_t size = 8 << 20;
  SharedMemory shm = FilledMemfd(size, false, Sealing::kReadOnly);
  const ArenaRecord record = RecordFor(shm);
  auto arena = PinnedArena::Adopt(std::move(shm), record, /*lock=*/false);
  ASSERT_TRUE(arena.ok()) << arena.status().ToString();
  EXPECT_TRUE(arena->adopted());
  EXPECT_EQ(arena->size(), size);
  EXPECT_EQ(MappedKb(arena->data()), 0) << "adoption faulted pages in";
  EXPECT_EQ(arena->data()[5 * 4096], 6);
  const long mapped = MappedKb(arena->data());  // the page read, and those faulted around it
  EXPECT_GT(mapped, 0);
  EXPECT_LE(mapped, 64);
  EXPECT_EQ(arena->numa_node(), 3);
  EXPECT_TRUE(arena->numa_bound());
  EXPECT_EQ(arena->numa_source(), "gpu 0000:17:00.0");
  EXPECT_TRUE(arena->sealed_read_only());
  EXPECT_FALSE(arena->locked());
  arena->AwaitLock();  // none running: returns at once
  EXPECT_TRUE(arena->warnings().empty()) << ::testing::PrintToString(arena->warnings());
}

TEST(PinnedArenaAdoptTest, LocksInTheBackgroundAndSurvivesMoves) {
  const size_t size = 64 << 20;
  SharedMemory shm = FilledMemfd(size, false, Sealing::kReadOnly);
  const ArenaRecord record = RecordFor(shm);
  auto arena = PinnedArena::Adopt(std::move(shm), record, /*lock=*/true);
  ASSERT_TRUE(arena.ok()) << arena.status().ToString();
  const uint8_t* data = arena->data();
  PinnedArena moved = std::move(arena).value();  // while the lock may still run
  SharedMemory other_shm = FilledMemfd(4 << 20, false, Sealing::kReadOnly);
  const ArenaRecord other_record = RecordFor(other_shm);
  auto other = PinnedArena::Adopt(std::move(other_shm), other_record, true);
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  PinnedArena assigned = std::move(other).value();
  assigned = std::move(moved);  // stops the other's lock before unmapping it
  EXPECT_EQ(assigned.data(), data);
  assigned.AwaitLock();
  if (!assigned.locked()) {
    EXPECT_TRUE(AnyWarningContains(assigned, "ulimit -l"))
        << ::testing::PrintToString(assigned.warnings());
  } else if (kRealMlock) {
    EXPECT_EQ(MappedKb(assigned.data()), static_cast<long>(size >> 10)) << "locked, not faulted";
  }
  EXPECT_EQ(assigned.data()[size - 4096], static_cast<uint8_t>(size / 4096));
}

TEST(PinnedArenaAdoptTest, WritingThroughTheAdoptedMappingFaults) {
  SharedMemory shm = FilledMemfd(1 << 20, false, Sealing::kReadOnly);
  const ArenaRecord record = RecordFor(shm);
  auto arena = PinnedArena::Adopt(std::move(shm), record, false);
  ASSERT_TRUE(arena.ok());
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::signal(SIGSEGV, SIG_DFL);  // not a sanitizer's handler
    arena->data()[100] = 1;
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the write went through";
  EXPECT_EQ(WTERMSIG(status), SIGSEGV);
}

TEST(PinnedArenaAdoptTest, RefusesAMemfdThatIsNotTheRecordedOne) {
  auto refusal = [](SharedMemory shm, ArenaRecord record) {
    auto arena = PinnedArena::Adopt(std::move(shm), record, false);
    EXPECT_FALSE(arena.ok());
    EXPECT_EQ(arena.status().code(), StatusCode::kFailedPrecondition);
    return arena.status().message();
  };
  SharedMemory shm = FilledMemfd(1 << 20, false, Sealing::kReadOnly);
  ArenaRecord record = RecordFor(shm);
  record.size += 4096;
  EXPECT_NE(refusal(std::move(shm), record)
                .find("the memfd holds 1048576 bytes, the record says "
                      "1052672"),
            std::string::npos);
  shm = FilledMemfd(1 << 20, false, Sealing::kReadOnly);
  record = RecordFor(shm);
  record.huge_pages = true;
  EXPECT_NE(refusal(std::move(shm), record).find("4 KiB pages, the record says 2 MiB"),
            std::string::npos);
  shm = FilledMemfd(1 << 20, false, std::nullopt);
  record = RecordFor(shm);
  EXPECT_NE(refusal(std::move(shm), record)
                .find("lacks the seals F_SEAL_FUTURE_WRITE, F_SEAL_SHRINK, F_SEAL_GROW"),
            std::string::npos);
  shm = FilledMemfd(1 << 20, false, Sealing::kFixedSize);
  record = RecordFor(shm);
  const std::string sized = refusal(std::move(shm), record);
  EXPECT_NE(sized.find("lacks the seals F_SEAL_FUTURE_WRITE"), std::string::npos) << sized;
  EXPECT_EQ(sized.find("SHRINK"), std::string::npos) << sized;

  // Another memfd like the recorded one.
  shm = FilledMemfd(1 << 20, false, Sealing::kReadOnly);
  record = RecordFor(shm);
  shm = FilledMemfd(1 << 20, false, Sealing::kReadOnly);
  EXPECT_NE(refusal(std::move(shm), record).find("another object than the recorded one (inode "),
            std::string::npos);

  // Recorded as unsealed (a kernel that could not seal): adopted, with a warning.
  shm = FilledMemfd(1 << 20, false, std::nullopt);
  record = RecordFor(shm);
  record.sealed_read_only = false;
  auto unsealed = PinnedArena::Adopt(std::move(shm), record, false);
  ASSERT_TRUE(unsealed.ok()) << unsealed.status().ToString();
  EXPECT_FALSE(unsealed->sealed_read_only());
  EXPECT_TRUE(AnyWarningContains(*unsealed, "not sealed read-only"));
}

TEST(PinnedArenaAdoptTest, AdoptsHugePages) {
  if (HugePagesFree() < 2) GTEST_SKIP() << "no free huge pages";
  SharedMemory shm = FilledMemfd(2 * kHugePageSize, true, Sealing::kReadOnly);
  ASSERT_TRUE(shm.huge_pages());
  const ArenaRecord record = RecordFor(shm);
  auto arena = PinnedArena::Adopt(std::move(shm), record, true);
  ASSERT_TRUE(arena.ok()) << arena.status().ToString();
  EXPECT_TRUE(arena->huge_pages());
  arena->AwaitLock();
  EXPECT_TRUE(arena->locked() || AnyWarningContains(*arena, "ulimit -l"));
  EXPECT_EQ(arena->data()[kHugePageSize + 4096], static_cast<uint8_t>(kHugePageSize / 4096 + 2));
}

TEST(PinnedArenaAdoptTest, ReportsABackgroundLockFailureWithTheFix) {
  if (!kRealMlock) GTEST_SKIP() << "the sanitizer replaces mlock with a no-op";
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    struct rlimit lim {
      64 << 10, 64 << 10
    };
    if (!DropIpcLock() || ::setrlimit(RLIMIT_MEMLOCK, &lim) != 0) ::_exit(10);
    SharedMemory shm = FilledMemfd(4 << 20, false, Sealing::kReadOnly);
    const ArenaRecord record = RecordFor(shm);
    auto arena = PinnedArena::Adopt(std::move(shm), record, /*lock=*/true);
    if (!arena.ok()) ::_exit(11);
    arena->AwaitLock();
    if (arena->locked()) ::_exit(12);
    if (!AnyWarningContains(*arena, "mlock of 4194304 bytes failed") ||
        !AnyWarningContains(*arena, "ulimit -l")) {
      ::_exit(13);
    }
    ::_exit(arena->data()[4096] == 2 ? 0 : 14);  // still readable
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "10: setup, 11: adopt failed, 12: locked anyway, "
                                       "13: warning lacks the fix, 14: bytes differ";
}

}  // namespace
}  // namespace baton
