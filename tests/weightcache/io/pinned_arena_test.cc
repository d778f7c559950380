#include "weightcache/io/pinned_arena.h"

#include <gtest/gtest.h>
#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>

#include "weightcache/io/numa.h"

namespace baton {
namespace {

namespace fs = std::filesystem;

long HugePagesFree() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  long value = 0;
  while (in >> key >> value) {
    if (key == "HugePages_Free:") return value;
    in.ignore(256, '\n');
  }
  return 0;
}

bool AnyWarningContains(const PinnedArena& arena, const std::string& text) {
  for (const std::string& w : arena.warnings()) {
    if (w.find(text) != std::string::npos) return true;
  }
  return false;
}

// A directory laid out like the parts of /sys the arena reads.
class FakeSysfs {
 public:
  FakeSysfs() {
    char tmpl[] = "/tmp/baton-sysfs-XXXXXX";
    root_ = ::mkdtemp(tmpl);
    fs::create_directories(root_ + "/devices/system/node");
  }
  ~FakeSysfs() { fs::remove_all(root_); }
  void Write(const std::string& rel, const std::string& text) {
    fs::create_directories(fs::path(root_ + "/" + rel).parent_path());
    std::ofstream(root_ + "/" + rel) << text;
  }
  void AddGpu(const std::string& id, const std::string& node) {
    Write("bus/pci/devices/" + id + "/numa_node", node + "\n");
  }
  const std::string& root() const { return root_; }

 private:
  std::string root_;
};

TEST(PinnedArenaTest, RefusesSizeZero) {
  ArenaOptions options;
  auto arena = PinnedArena::Create(options);
  ASSERT_FALSE(arena.ok());
  EXPECT_EQ(arena.status().code(), StatusCode::kInvalidArgument);
}

TEST(PinnedArenaTest, CreatesMapsAndSharesByFd) {
  ArenaOptions options;
  options.name = "test-arena";
  options.size = 3 * kHugePageSize + 123;
  auto arena = PinnedArena::Create(options);
  ASSERT_TRUE(arena.ok()) << arena.status().ToString();
  ASSERT_GE(arena->size(), options.size);
  EXPECT_TRUE(arena->numa_bound()) << ::testing::PrintToString(arena->warnings());
  EXPECT_TRUE(arena->locked() || AnyWarningContains(*arena, "ulimit -l"));
  if (!arena->huge_pages()) {
    EXPECT_TRUE(AnyWarningContains(*arena, "vm.nr_hugepages"));
  }
  for (uint64_t i = 0; i < arena->size(); i += 4093) arena->data()[i] = static_cast<uint8_t>(i);

  // What an engine does: receive a dup of the fd, import it, map it read-only.
  auto fd = arena->memory().Dup();
  ASSERT_TRUE(fd.ok());
  auto imported = SharedMemory::Import(std::move(fd).value());
  ASSERT_TRUE(imported.ok()) << imported.status().ToString();
  EXPECT_EQ(imported->size(), arena->size());
  EXPECT_EQ(imported->huge_pages(), arena->huge_pages());
  auto view = imported->Map(Protection::kReadOnly);
  ASSERT_TRUE(view.ok());
  EXPECT_NE(view->data(), arena->data());
  EXPECT_EQ(std::memcmp(view->data(), arena->data(), arena->size()), 0);
  EXPECT_EQ(view->data()[4093 * 7], static_cast<uint8_t>(4093 * 7));
}

TEST(PinnedArenaTest, MovesKeepTheMapping) {
  ArenaOptions options;
  options.size = 1 << 20;
  options.huge_pages = false;
  auto arena = PinnedArena::Create(options);
  ASSERT_TRUE(arena.ok());
  uint8_t* data = arena->data();
  data[10] = 42;
  PinnedArena moved = std::move(arena).value();
  EXPECT_EQ(moved.data(), data);
  EXPECT_EQ(moved.data()[10], 42);
}

TEST(PinnedArenaTest, NormalPagesWhenHugePagesAreOff) {
  ArenaOptions options;
  options.size = 5 * 4096 + 1;
  options.huge_pages = false;
  auto arena = PinnedArena::Create(options);
  ASSERT_TRUE(arena.ok()) << arena.status().ToString();
  EXPECT_FALSE(arena->huge_pages());
  EXPECT_EQ(arena->size(), 6u * 4096);
  EXPECT_FALSE(AnyWarningContains(*arena, "huge pages"));
  arena->data()[arena->size() - 1] = 1;  // writable to the end
}

TEST(PinnedArenaTest, FallsBackToNormalPagesWhenTooFewHugePagesAreFree) {
  // More huge pages than are free: the mmap reservation fails and the arena falls back.
  // Not populated or locked, so the normal-page arena costs nothing until touched.
  ArenaOptions options;
  options.size = static_cast<uint64_t>(HugePagesFree() + 64) * kHugePageSize;
  options.populate = false;
  options.lock = false;
  auto arena = PinnedArena::Create(options);
  ASSERT_TRUE(arena.ok()) << arena.status().ToString();
  EXPECT_FALSE(arena->huge_pages());
  EXPECT_TRUE(AnyWarningContains(*arena, "vm.nr_hugepages"))
      << ::testing::PrintToString(arena->warnings());
  EXPECT_GE(arena->size(), options.size);
}

// Drops CAP_IPC_LOCK from the calling process (so that RLIMIT_MEMLOCK applies to root too).
bool DropIpcLock() {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2]{};
  if (::syscall(SYS_capget, &header, data) != 0) return false;
  data[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
  return ::syscall(SYS_capset, &header, data) == 0;
}

TEST(PinnedArenaTest, ReportsMlockFailureWithTheFix) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer replaces mlock with a no-op that reports success";
#endif
  // In a child: a 64 KiB memlock limit, no CAP_IPC_LOCK, and a 4 MiB arena.
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    struct rlimit lim {
      64 << 10, 64 << 10
    };
    if (!DropIpcLock() || ::setrlimit(RLIMIT_MEMLOCK, &lim) != 0) ::_exit(10);
    ArenaOptions options;
    options.size = 4 << 20;
    options.huge_pages = false;
    auto arena = PinnedArena::Create(options);
    if (!arena.ok()) ::_exit(11);
    if (arena->locked()) ::_exit(12);
    if (!AnyWarningContains(*arena, "ulimit -l") ||
        !AnyWarningContains(*arena, "RLIMIT_MEMLOCK is 65536 bytes")) {
      ::_exit(13);
    }
    arena->data()[options.size - 1] = 7;  // still usable
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "10: setup, 11: create failed, 12: locked anyway, "
                                       "13: warning lacks the fix";
}

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

TEST(PinnedArenaTest, BindsToTheRequestedNode) {
  ArenaOptions options;
  options.size = 2 * kHugePageSize;
  options.numa_node = 0;
  auto arena = PinnedArena::Create(options);
  ASSERT_TRUE(arena.ok()) << arena.status().ToString();
  EXPECT_EQ(arena->numa_node(), 0);
  EXPECT_EQ(arena->numa_source(), "config");
  ASSERT_TRUE(arena->numa_bound());
  auto node = NodeOfAddress(arena->data() + arena->size() - 1);
  ASSERT_TRUE(node.ok()) << node.status().ToString();
  EXPECT_EQ(*node, 0);
}

TEST(PinnedArenaTest, RefusesANodeThatIsNotOnline) {
  FakeSysfs sysfs;
  sysfs.Write("devices/system/node/online", "0\n");
  ArenaOptions options;
  options.size = 4096;
  options.numa_node = 5;
  options.sysfs_root = sysfs.root();
  auto arena = PinnedArena::Create(options);
  ASSERT_FALSE(arena.ok());
  EXPECT_EQ(arena.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(arena.status().message().find("NUMA node 5 is not online (online nodes: 0)"),
            std::string::npos)
      << arena.status().message();
}

TEST(PinnedArenaTest, GpuOnAnOfflineNodeFallsBackWithAWarning) {
  FakeSysfs sysfs;
  sysfs.Write("devices/system/node/online", "0\n");
  sysfs.AddGpu("0000:17:00.0", "3");
  ArenaOptions options;
  options.size = 4096;
  options.huge_pages = false;
  options.gpu_pci_bus_id = "17:00.0";
  options.sysfs_root = sysfs.root();
  auto arena = PinnedArena::Create(options);
  ASSERT_TRUE(arena.ok()) << arena.status().ToString();
  EXPECT_EQ(arena->numa_node(), 0);
  EXPECT_TRUE(AnyWarningContains(*arena, "NUMA node 3 (from gpu 0000:17:00.0) is not online"));
}

// Huge pages are reserved globally but the arena is bound to one node: too few free on
// that node mean normal pages from the start, with the reason, not a failed population.
TEST(PinnedArenaTest, TooFewHugePagesOnTheNodeMeanNormalPages) {
  FakeSysfs sysfs;
  sysfs.Write("devices/system/node/online", "0\n");
  sysfs.Write("devices/system/node/node0/hugepages/hugepages-2048kB/free_hugepages", "1\n");
  ArenaOptions options;
  options.size = 3 * kHugePageSize;
  options.numa_node = 0;
  options.sysfs_root = sysfs.root();
  auto arena = PinnedArena::Create(options);
  ASSERT_TRUE(arena.ok()) << arena.status().ToString();
  EXPECT_FALSE(arena->huge_pages());
  EXPECT_TRUE(AnyWarningContains(*arena, "NUMA node 0 has 1 free 2 MiB huge pages of the 3"))
      << ::testing::PrintToString(arena->warnings());
}

TEST(NumaTest, ChoosesRequestedThenGpuThenLocal) {
  FakeSysfs sysfs;
  sysfs.AddGpu("0000:17:00.0", "1");
  sysfs.AddGpu("0000:65:00.0", "-1");
  const int local = CurrentNumaNode();
  EXPECT_EQ(ChooseNumaNode(2, "0000:17:00.0", sysfs.root()), 2);
  EXPECT_EQ(ChooseNumaNode(-1, "0000:17:00.0", sysfs.root()), 1);
  EXPECT_EQ(ChooseNumaNode(-1, "00000000:17:00.0", sysfs.root()), 1);  // nvidia-smi form
  EXPECT_EQ(ChooseNumaNode(-1, "17:00.0", sysfs.root()), 1);
  EXPECT_EQ(ChooseNumaNode(-1, "0000:65:00.0", sysfs.root()), local);
  EXPECT_EQ(ChooseNumaNode(-1, "0000:99:00.0", sysfs.root()), local);
  EXPECT_EQ(ChooseNumaNode(-1, "", sysfs.root()), local);
  EXPECT_EQ(ChooseNumaNode(-1, ""), local);

  NumaChoice gpu = ResolveNumaNode(-1, "0000:17:00.0", sysfs.root());
  EXPECT_EQ(gpu.source, "gpu 0000:17:00.0");
  EXPECT_TRUE(gpu.warning.empty());
  NumaChoice missing = ResolveNumaNode(-1, "0000:99:00.0", sysfs.root());
  EXPECT_NE(missing.warning.find("cannot read the NUMA node of GPU 0000:99:00.0"),
            std::string::npos);
  NumaChoice bad = ResolveNumaNode(-1, "gpu0", sysfs.root());
  EXPECT_NE(bad.warning.find("malformed"), std::string::npos);
  NumaChoice unknown = ResolveNumaNode(-1, "0000:65:00.0", sysfs.root());
  EXPECT_TRUE(unknown.warning.empty());
  EXPECT_NE(unknown.source.find("reports no NUMA node"), std::string::npos);
}

TEST(NumaTest, GarbageInSysfsFallsBackToLocal) {
  FakeSysfs sysfs;
  sysfs.AddGpu("0000:17:00.0", "one");
  EXPECT_EQ(ChooseNumaNode(-1, "0000:17:00.0", sysfs.root()), CurrentNumaNode());
}

TEST(NumaTest, NormalizesPciBusIds) {
  EXPECT_EQ(NormalizePciBusId("0000:17:00.0"), "0000:17:00.0");
  EXPECT_EQ(NormalizePciBusId("17:00.0"), "0000:17:00.0");
  EXPECT_EQ(NormalizePciBusId("00000000:AB:1F.3"), "0000:ab:1f.3");
  EXPECT_EQ(NormalizePciBusId("1:17:00.0"), "0001:17:00.0");
  EXPECT_EQ(NormalizePciBusId("10000000:17:00.0"), std::nullopt);
  EXPECT_EQ(NormalizePciBusId("17:00"), std::nullopt);
  EXPECT_EQ(NormalizePciBusId("17:0.0"), std::nullopt);
  EXPECT_EQ(NormalizePciBusId("zz:00.0"), std::nullopt);
  EXPECT_EQ(NormalizePciBusId(""), std::nullopt);
  EXPECT_EQ(NormalizePciBusId("../../x:00.0"), std::nullopt);
}

TEST(NumaTest, ParsesNodeLists) {
  EXPECT_EQ(ParseNodeList("0"), (std::vector<int>{0}));
  EXPECT_EQ(ParseNodeList("0-2,5\n"), (std::vector<int>{0, 1, 2, 5}));
  EXPECT_EQ(ParseNodeList(""), (std::vector<int>{}));
  EXPECT_EQ(ParseNodeList("2-1"), std::nullopt);
  EXPECT_EQ(ParseNodeList("a"), std::nullopt);
  EXPECT_EQ(ParseNodeList("1,,2"), std::nullopt);

  FakeSysfs sysfs;
  EXPECT_EQ(OnlineNumaNodes(sysfs.root()), (std::vector<int>{0}));  // file missing
  sysfs.Write("devices/system/node/online", "0-1,3\n");
  EXPECT_EQ(OnlineNumaNodes(sysfs.root()), (std::vector<int>{0, 1, 3}));
  EXPECT_FALSE(OnlineNumaNodes().empty());
}

}  // namespace
}  // namespace baton
