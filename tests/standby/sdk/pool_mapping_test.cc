#include "standby/sdk/pool_mapping.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "proto/transport/shared_memory.h"

namespace baton {
namespace {

constexpr uint64_t kBlock = 64 * 1024;

PoolMapping Reserve(uint32_t blocks, SharedMemory* memory) {
  *memory =
      std::move(SharedMemory::Create(
                    {.name = "baton-pool-test", .size = blocks * kBlock, .try_huge_pages = false}))
          .value();
  Result<UniqueFd> fd = memory->Dup();
  EXPECT_TRUE(fd.ok());
  Result<PoolMapping> pool =
      PoolMapping::Reserve(std::move(fd).value(), {.block_count = blocks,
                                                   .block_bytes = kBlock,
                                                   .reserve_bytes = blocks * kBlock,
                                                   .huge_pages = false});
  EXPECT_TRUE(pool.ok()) << pool.status().ToString();
  return std::move(pool).value();
}

TEST(PoolMapping, MapsCoalescesSplitsAndScrubs) {
  SharedMemory memory;
  PoolMapping pool = Reserve(8, &memory);
  Mapping owner = std::move(memory.Map(Protection::kReadWrite)).value();
  EXPECT_EQ(pool.mapped_blocks(), 0u);
  ASSERT_TRUE(pool.MapExtent(2, 2).ok());
  ASSERT_TRUE(pool.MapExtent(4, 1).ok());
  ASSERT_EQ(pool.mapped().size(), 1u);
  EXPECT_EQ(pool.mapped().at(2), 3u);
  EXPECT_FALSE(pool.MapExtent(3, 2).ok()) << "overlap";
  EXPECT_FALSE(pool.MapExtent(7, 2).ok()) << "outside the pool";
  pool.BlockData(3)[10] = 42;
  EXPECT_EQ(owner.data()[3 * kBlock + 10], 42) << "shared with the owner";
  owner.data()[4 * kBlock] = 9;
  pool.ScrubHeaders(4, 1, 64);
  EXPECT_EQ(owner.data()[4 * kBlock], 0);
  ASSERT_TRUE(pool.UnmapExtent(3, 1).ok());
  EXPECT_FALSE(pool.IsMapped(3));
  EXPECT_TRUE(pool.IsMapped(2));
  EXPECT_TRUE(pool.IsMapped(4));
  EXPECT_EQ(pool.mapped().size(), 2u);
  EXPECT_FALSE(pool.UnmapExtent(3, 1).ok()) << "not mapped";
  pool.UnmapAll();
  EXPECT_EQ(pool.mapped_blocks(), 0u);
}

TEST(PoolMapping, RefusesBadGeometry) {
  auto reserve = [](PoolGeometryArgs args, uint64_t size) {
    SharedMemory m =
        std::move(SharedMemory::Create({.name = "g", .size = size, .try_huge_pages = false}))
            .value();
    return PoolMapping::Reserve(std::move(m.Dup()).value(), args);
  };
  EXPECT_FALSE(
      reserve({.block_count = 0, .block_bytes = kBlock, .reserve_bytes = kBlock}, kBlock).ok());
  EXPECT_FALSE(reserve({.block_count = 1, .block_bytes = 1000, .reserve_bytes = 1000}, 4096).ok());
  Result<PoolMapping> small =
      reserve({.block_count = 4, .block_bytes = kBlock, .reserve_bytes = 4 * kBlock}, kBlock);
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.status().message().find("pool fd holds"), std::string::npos);
  EXPECT_FALSE(
      reserve({.block_count = 2, .block_bytes = kBlock, .reserve_bytes = kBlock}, 2 * kBlock).ok());
  EXPECT_FALSE(
      reserve(
          {.block_count = 1, .block_bytes = kBlock, .reserve_bytes = kBlock, .huge_pages = true},
          kBlock)
          .ok());
}

// Blocks of 4096 bytes whose first byte and header end say which block they are.
PoolMapping ReserveNumbered(uint32_t blocks, SharedMemory* memory) {
  constexpr uint64_t kSmall = 4096;
  *memory = std::move(SharedMemory::Create({.name = "baton-pool-headers",
                                            .size = blocks * kSmall,
                                            .try_huge_pages = false}))
                .value();
  Mapping owner = std::move(memory->Map(Protection::kReadWrite)).value();
  for (uint32_t b = 0; b < blocks; ++b) {
    std::memcpy(owner.data() + b * kSmall, &b, sizeof(b));
    owner.data()[b * kSmall + 63] = static_cast<uint8_t>(b % 251);
  }
  return std::move(PoolMapping::Reserve(std::move(memory->Dup()).value(),
                                        {.block_count = blocks,
                                         .block_bytes = kSmall,
                                         .reserve_bytes = blocks * kSmall,
                                         .huge_pages = false}))
      .value();
}

// The blocks whose headers `out` holds, in order (from each header's first bytes), checking
// each header's last byte.
std::vector<uint32_t> BlocksIn(const std::vector<uint8_t>& out) {
  std::vector<uint32_t> blocks;
  for (size_t at = 0; at + 64 <= out.size(); at += 64) {
    uint32_t b;
    std::memcpy(&b, out.data() + at, sizeof(b));
    EXPECT_EQ(out[at + 63], static_cast<uint8_t>(b % 251)) << "block " << b;
    blocks.push_back(b);
  }
  return blocks;
}

std::vector<uint32_t> Blocks(std::initializer_list<BlockRun> runs) {
  std::vector<uint32_t> blocks;
  for (const BlockRun& r : runs) {
    for (uint32_t b = r.first; b < r.first + r.count; ++b) blocks.push_back(b);
  }
  return blocks;
}

TEST(PoolMapping, ReadsTheHeadersOfManyRunsInOrderOnSeveralThreads) {
  SharedMemory memory;
  const PoolMapping pool = ReserveNumbered(9000, &memory);
  // 8,600 blocks: four slices of the flat order, which split runs in their middle.
  const std::vector<BlockRun> runs = {{5000, 3000}, {3, 1}, {10, 4990}, {8100, 600}};
  for (unsigned threads : {1u, 4u, 64u}) {
    std::vector<uint8_t> out = {7};  // appended to, not replaced
    const std::vector<Status> read = pool.ReadHeaders(runs, 64, threads, &out);
    ASSERT_EQ(read.size(), runs.size());
    for (const Status& s : read) EXPECT_TRUE(s.ok()) << s.ToString();
    ASSERT_EQ(out.size(), 1 + 8591 * 64u) << threads << " threads";
    EXPECT_EQ(out[0], 7);
    out.erase(out.begin());
    EXPECT_EQ(BlocksIn(out), Blocks({{5000, 3000}, {3, 1}, {10, 4990}, {8100, 600}}));
  }
  EXPECT_EQ(pool.mapped_blocks(), 0u) << "nothing is mapped to read them";
}

TEST(PoolMapping, ARunThatCannotBeReadLeavesTheOthersWhole) {
  SharedMemory memory;
  const PoolMapping pool = ReserveNumbered(6000, &memory);
  // The pool's file shrinks under the mapping: blocks from 5000 on read nothing.
  ASSERT_EQ(::ftruncate(memory.fd(), 5000 * 4096), 0);
  const std::vector<BlockRun> runs = {{0, 2500}, {4990, 20}, {6000, 1}, {2500, 2000}, {5, 0}};
  std::vector<uint8_t> out;
  const std::vector<Status> read = pool.ReadHeaders(runs, 64, 4, &out);
  ASSERT_EQ(read.size(), runs.size());
  EXPECT_TRUE(read[0].ok());
  EXPECT_EQ(read[1].code(), StatusCode::kDataLoss) << read[1].ToString();
  EXPECT_NE(read[1].message().find("pool block 5000"), std::string::npos) << read[1].ToString();
  EXPECT_EQ(read[2].code(), StatusCode::kInvalidArgument) << "outside the pool";
  EXPECT_TRUE(read[3].ok());
  EXPECT_FALSE(read[4].ok()) << "an empty run";
  EXPECT_EQ(BlocksIn(out), Blocks({{0, 2500}, {2500, 2000}}));
}

TEST(PoolMapping, AHeaderViewReadsWhatPreadReadsAndWhatIsWrittenAfterIt) {
  SharedMemory memory;
  PoolMapping pool = ReserveNumbered(9000, &memory);
  ASSERT_TRUE(memory.Seal(Sealing::kFixedSize).ok());
  ASSERT_TRUE(pool.MapHeaderView().ok());
  ASSERT_TRUE(pool.has_header_view());
  pool.PrefaultHeaderView(0, 9000);
  pool.PrefaultHeaderView(8990, 100);  // outside the pool: nothing touched, nothing raised
  // Written after the view's pages were faulted in: the view shares the pool's pages.
  Mapping owner = std::move(memory.Map(Protection::kReadWrite)).value();
  const uint32_t moved = 8100;
  owner.data()[uint64_t{moved} * 4096 + 63] = 0xEE;
  const std::vector<BlockRun> runs = {{5000, 3000}, {3, 1}, {10, 4990}, {8100, 600}};
  for (unsigned threads : {1u, 4u}) {
    std::vector<uint8_t> out;
    const std::vector<Status> read = pool.ReadHeaders(runs, 64, threads, &out);
    for (const Status& s : read) EXPECT_TRUE(s.ok()) << s.ToString();
    ASSERT_EQ(out.size(), 8591 * 64u);
    const size_t at = (3000 + 1 + 4990) * 64u;  // block 8100, the fourth run's first
    EXPECT_EQ(out[at + 63], 0xEE);
    out[at + 63] = static_cast<uint8_t>(moved % 251);
    EXPECT_EQ(BlocksIn(out), Blocks({{5000, 3000}, {3, 1}, {10, 4990}, {8100, 600}}));
  }
  EXPECT_EQ(pool.mapped_blocks(), 0u) << "the view maps nothing writable";
}

TEST(PoolMapping, AnUnsealedPoolHasNoHeaderViewAndIsReadWithPread) {
  SharedMemory memory;
  PoolMapping pool = ReserveNumbered(600, &memory);
  const Status view = pool.MapHeaderView();
  EXPECT_EQ(view.code(), StatusCode::kFailedPrecondition) << view.ToString();
  EXPECT_NE(view.message().find("not sealed against shrinking"), std::string::npos);
  EXPECT_FALSE(pool.has_header_view());
  std::vector<uint8_t> out;
  const std::vector<BlockRun> runs = {{0, 600}};
  EXPECT_TRUE(pool.ReadHeaders(runs, 64, 2, &out)[0].ok());
  EXPECT_EQ(BlocksIn(out), Blocks({{0, 600}}));
}

}  // namespace
}  // namespace baton
