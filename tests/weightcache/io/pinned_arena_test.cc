#include "weightcache/io/pinned_arena.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>

#include "tests/weightcache/io/pinned_arena_testutil.h"
#include "weightcache/io/numa.h"

namespace baton {
namespace {

namespace fs = std::filesystem;
using arena_testing::AnyWarningContains;
using arena_testing::DropIpcLock;
using arena_testing::HugePagesFree;

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

TEST(PinnedArenaTest, FallsBackToNormalPagesWhenNoHugePagesAreFree) {
  // None free (on the arena's node, as sysfs says): normal pages, with the way to fix it.
  // Not populated or locked, so the normal-page arena costs nothing until touched.
  FakeSysfs sysfs;
  sysfs.Write("devices/system/node/online", "0\n");
  sysfs.Write("devices/system/node/node0/hugepages/hugepages-2048kB/free_hugepages", "0\n");
  ArenaOptions options;
  options.size = 64 * kHugePageSize;
  options.numa_node = 0;
  options.sysfs_root = sysfs.root();
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
// that node mean a partial arena (that many huge pages, normal pages for the rest) from the
// start, with the reason, not a failed population.
TEST(PinnedArenaTest, TooFewHugePagesOnTheNodeMeanAPartialArena) {
  FakeSysfs sysfs;
  sysfs.Write("devices/system/node/online", "0\n");
  sysfs.Write("devices/system/node/node0/hugepages/hugepages-2048kB/free_hugepages", "1\n");
  ArenaOptions options;
  options.size = 3 * kHugePageSize;
  options.numa_node = 0;
  options.sysfs_root = sysfs.root();
  auto arena = PinnedArena::Create(options);
  ASSERT_TRUE(arena.ok()) << arena.status().ToString();
  if (HugePagesFree() >= 1) {
    EXPECT_TRUE(arena->partial());
    EXPECT_EQ(arena->huge_bytes(), kHugePageSize);
    EXPECT_EQ(arena->small_bytes(), 2 * kHugePageSize);
    EXPECT_TRUE(AnyWarningContains(*arena, "NUMA node 0 has 1 free 2 MiB huge pages of the 3"))
        << ::testing::PrintToString(arena->warnings());
  } else {  // the machine has none: the machine's count is the reason
    EXPECT_FALSE(arena->huge_pages());
    EXPECT_TRUE(AnyWarningContains(*arena, "free 2 MiB huge pages of the 3"))
        << ::testing::PrintToString(arena->warnings());
  }
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
