// A partial weight arena: as many 2 MiB huge pages as it may have (HugePageBudget), 4 KiB
// pages for the rest, in two memfds mapped back to back. The cap (max_huge_pages) makes one on
// purpose; where the machine has no free huge pages, the tests that need real ones skip.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "tests/weightcache/io/pinned_arena_testutil.h"
#include "weightcache/io/huge_page_budget.h"
#include "weightcache/io/pinned_arena.h"

namespace baton {
namespace {

using arena_testing::AnyWarningContains;
using arena_testing::HugePagesFree;

constexpr uint64_t kSize = 3 * kHugePageSize + 3 * 4096;  // 4 huge pages' worth, not a multiple

uint8_t ByteAt(size_t i) { return static_cast<uint8_t>(i * 7 + i / 4096); }

ArenaOptions PartialOptions(int64_t max_huge_pages) {
  ArenaOptions options;
  options.name = "partial-test";
  options.size = kSize;
  options.max_huge_pages = max_huge_pages;
  options.lock = false;
  return options;
}

// What Manifest() records of an arena, for Adopt().
ArenaRecord RecordOf(const PinnedArena& a) {
  ArenaRecord r;
  r.size = a.size();
  r.huge_pages = a.huge_pages();
  std::tie(r.inode, r.device) = a.identity();
  if (a.partial()) {
    r.first_size = a.memory().size();
    std::tie(r.second_inode, r.second_device) = a.second_identity();
  }
  r.sealed_read_only = a.sealed_read_only();
  return r;
}

std::vector<SharedMemory> Parts(const PinnedArena& a) {
  auto fds = a.DupFds();
  EXPECT_TRUE(fds.ok()) << fds.status().ToString();
  auto parts = ImportArenaFds(std::move(fds).value());
  EXPECT_TRUE(parts.ok()) << parts.status().ToString();
  return std::move(parts).value();
}

// A partial arena on one huge page, every byte ByteAt(its offset), sealed read-only.
void MakeSealedPartialArena(std::optional<PinnedArena>* out) {
  auto arena = PinnedArena::Create(PartialOptions(1));
  ASSERT_TRUE(arena.ok()) << arena.status().ToString();
  ASSERT_TRUE(arena->partial());
  for (size_t i = 0; i < arena->size(); ++i) arena->data()[i] = ByteAt(i);
  arena->SealReadOnly();
  out->emplace(std::move(arena).value());
}

#define SKIP_WITHOUT_HUGE_PAGES(n)                                                \
  if (HugePagesFree() < (n))                                                      \
  GTEST_SKIP() << "needs " << (n) << " free 2 MiB huge pages (HugePages_Free is " \
               << HugePagesFree() << "; `sysctl vm.nr_hugepages=N` reserves them)"

TEST(PartialArenaTest, TakesTheHugePagesItMayAndFourKiBPagesForTheRest) {
  SKIP_WITHOUT_HUGE_PAGES(2);
  auto arena = PinnedArena::Create(PartialOptions(2));
  ASSERT_TRUE(arena.ok()) << arena.status().ToString();
  ASSERT_TRUE(arena->partial());
  EXPECT_TRUE(arena->memory().huge_pages());
  EXPECT_FALSE(arena->second_memory().huge_pages());
  EXPECT_EQ(arena->huge_bytes(), 2 * kHugePageSize);  // the split is on a 2 MiB boundary
  EXPECT_EQ(arena->small_bytes(), kSize - 2 * kHugePageSize);
  EXPECT_EQ(arena->size(), kSize);
  EXPECT_TRUE(AnyWarningContains(*arena, "partial huge pages: 4194304 bytes on 2 MiB pages, " +
                                             std::to_string(kSize - 4194304) +
                                             " bytes on 4 KiB pages (the arena may take at most 2"))
      << ::testing::PrintToString(arena->warnings());
}

TEST(PartialArenaTest, OffsetsAcrossTheSplitReadTheSameInAnotherMapping) {
  SKIP_WITHOUT_HUGE_PAGES(1);
  std::optional<PinnedArena> arena;
  ASSERT_NO_FATAL_FAILURE(MakeSealedPartialArena(&arena));
  EXPECT_TRUE(arena->sealed_read_only()) << ::testing::PrintToString(arena->warnings());

  // What an engine does with the fds it is sent: one read-only range over both.
  std::vector<SharedMemory> parts = Parts(*arena);
  ASSERT_EQ(parts.size(), 2u);
  auto peer = MapBackToBack(parts[0], parts[1], Protection::kReadOnly);
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  ASSERT_EQ(peer->size(), arena->size());
  EXPECT_EQ(std::memcmp(peer->data(), arena->data(), arena->size()), 0);
  // The bytes on either side of the split, and the last one, are where the offsets say.
  EXPECT_EQ(peer->data()[kHugePageSize - 1], ByteAt(kHugePageSize - 1));
  EXPECT_EQ(peer->data()[kHugePageSize], ByteAt(kHugePageSize));
  EXPECT_EQ(peer->data()[kSize - 1], ByteAt(kSize - 1));
  // Sealed: neither part can be mapped writable by a peer.
  EXPECT_FALSE(MapBackToBack(parts[0], parts[1], Protection::kReadWrite).ok());
  EXPECT_FALSE(parts[1].Map(Protection::kReadWrite).ok());
}

TEST(PartialArenaTest, AdoptTakesBothMemfdsAndRefusesOneOfThemAlone) {
  SKIP_WITHOUT_HUGE_PAGES(1);
  std::optional<PinnedArena> arena;
  ASSERT_NO_FATAL_FAILURE(MakeSealedPartialArena(&arena));
  const ArenaRecord record = RecordOf(*arena);

  std::vector<SharedMemory> first_only = Parts(*arena);
  first_only.pop_back();
  auto alone = PinnedArena::Adopt(std::move(first_only), record, false);
  ASSERT_FALSE(alone.ok());
  EXPECT_NE(alone.status().message().find("1 memfds, the record says 2"), std::string::npos)
      << alone.status().ToString();

  std::vector<SharedMemory> swapped = Parts(*arena);
  std::swap(swapped[0], swapped[1]);
  EXPECT_FALSE(PinnedArena::Adopt(std::move(swapped), record, false).ok());

  auto adopted = PinnedArena::Adopt(Parts(*arena), record, false);
  ASSERT_TRUE(adopted.ok()) << adopted.status().ToString();
  EXPECT_TRUE(adopted->partial());
  EXPECT_EQ(adopted->huge_bytes(), kHugePageSize);
  EXPECT_EQ(adopted->small_bytes(), kSize - kHugePageSize);
  EXPECT_EQ(std::memcmp(adopted->data(), arena->data(), kSize), 0);
}

TEST(PartialArenaTest, ACapOfZeroIsOneMemfdOfFourKiBPagesWithTheReason) {
  auto arena = PinnedArena::Create(PartialOptions(0));
  ASSERT_TRUE(arena.ok()) << arena.status().ToString();
  EXPECT_FALSE(arena->partial());
  EXPECT_FALSE(arena->huge_pages());
  EXPECT_EQ(arena->huge_bytes(), 0u);
  EXPECT_EQ(arena->small_bytes(), arena->size());
  ASSERT_EQ(arena->DupFds()->size(), 1u);
  EXPECT_TRUE(AnyWarningContains(*arena, "at most 0 huge pages"))
      << ::testing::PrintToString(arena->warnings());
}

TEST(PartialArenaTest, AllTheHugePagesItNeedsIsOneHugetlbMemfdAsBefore) {
  SKIP_WITHOUT_HUGE_PAGES(4);
  auto arena = PinnedArena::Create(PartialOptions(4));
  ASSERT_TRUE(arena.ok()) << arena.status().ToString();
  EXPECT_FALSE(arena->partial());
  EXPECT_TRUE(arena->huge_pages());
  EXPECT_EQ(arena->size(), 4 * kHugePageSize);
  EXPECT_EQ(arena->small_bytes(), 0u);
  EXPECT_EQ(arena->DupFds()->size(), 1u);
}

TEST(HugePageBudgetTest, TheCapAndTheNodeLimitWhatTheArenaTakes) {
  const HugePageBudget capped = BudgetHugePages(5 * kHugePageSize + 1, 0, 2, "/nonexistent");
  EXPECT_EQ(capped.needed, 6u);
  EXPECT_LE(capped.pages, 2u);
  EXPECT_NE(capped.why.find("of the 6"), std::string::npos) << capped.why;
  const HugePageBudget uncapped = BudgetHugePages(kHugePageSize, 0, -1, "/nonexistent");
  EXPECT_EQ(uncapped.needed, 1u);
  EXPECT_EQ(uncapped.pages, HugePagesFree() >= 1 ? 1u : 0u);
}

}  // namespace
}  // namespace baton
