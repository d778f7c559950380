#include "standby/sdk/pool_mapping.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace baton
