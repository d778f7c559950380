// BlockAllocator: whole-block, first-fit allocations inside the extents an engine holds.
#include "standby/sdk/block_allocator.h"

#include <gtest/gtest.h>

namespace baton {
namespace {

constexpr uint64_t kBase = 0x7f0000000000;
constexpr uint64_t kBlock = 4096;

TEST(BlockAllocatorTest, AllocatesWholeBlocksFirstFitInsideHeldExtents) {
  BlockAllocator a(kBase, kBlock, 16);
  ASSERT_TRUE(a.Reset({{2, 3}, {8, 6}}).ok());
  EXPECT_EQ(a.free_bytes(), 9 * kBlock);
  EXPECT_EQ(*a.Allocate(1), kBase + 2 * kBlock);           // one block
  EXPECT_EQ(*a.Allocate(2 * kBlock), kBase + 3 * kBlock);  // blocks 3, 4
  EXPECT_EQ(*a.Allocate(kBlock + 1), kBase + 8 * kBlock);  // 2 blocks: the next held run
  EXPECT_EQ(a.Allocate(5 * kBlock).status().code(), StatusCode::kResourceExhausted)
      << "4 blocks are left, and not one run of 5";
  EXPECT_EQ(*a.Allocate(4 * kBlock), kBase + 10 * kBlock);
  EXPECT_EQ(a.free_bytes(), 0u);
  EXPECT_EQ(a.allocated_bytes(), 9 * kBlock);
  EXPECT_EQ(a.Allocate(0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a.Allocate(UINT64_MAX).status().code(), StatusCode::kResourceExhausted);
}

TEST(BlockAllocatorTest, FreeingMakesRoomAgainAndOnlyForRealAllocations) {
  BlockAllocator a(kBase, kBlock, 8);
  ASSERT_TRUE(a.Reset({{0, 8}}).ok());
  const uint64_t x = *a.Allocate(3 * kBlock);
  const uint64_t y = *a.Allocate(3 * kBlock);
  EXPECT_EQ(a.Allocate(3 * kBlock).status().code(), StatusCode::kResourceExhausted);
  ASSERT_TRUE(a.Free(x).ok());
  EXPECT_EQ(*a.Allocate(3 * kBlock), x);
  EXPECT_EQ(a.Free(y + kBlock).code(), StatusCode::kNotFound) << "not the start of one";
  ASSERT_TRUE(a.Free(y).ok());
  EXPECT_EQ(a.Free(y).code(), StatusCode::kNotFound) << "freed twice";
}

TEST(BlockAllocatorTest, ResetFollowsGrantsAndReturnsButKeepsAllocationsHeld) {
  BlockAllocator a(kBase, kBlock, 8);
  ASSERT_TRUE(a.Reset({{0, 2}}).ok());
  const uint64_t x = *a.Allocate(2 * kBlock);
  ASSERT_TRUE(a.Reset({{0, 8}}).ok()) << "a grant";
  EXPECT_EQ(a.free_bytes(), 6 * kBlock);
  EXPECT_EQ(a.Reset({{4, 4}}).code(), StatusCode::kFailedPrecondition)
      << "blocks 0 and 1 are allocated: they should not have been returned";
  EXPECT_EQ(a.free_bytes(), 4 * kBlock) << "the free blocks follow the extents all the same";
  EXPECT_EQ(*a.Allocate(kBlock), kBase + 4 * kBlock) << "never a block that is no longer held";
  ASSERT_TRUE(a.Free(kBase + 4 * kBlock).ok());
  ASSERT_TRUE(a.Free(x).ok());
  ASSERT_TRUE(a.Reset({{4, 4}}).ok());
  EXPECT_EQ(*a.Allocate(kBlock), kBase + 4 * kBlock);
  EXPECT_EQ(a.Reset({{6, 3}}).code(), StatusCode::kInvalidArgument) << "past the pool";
}

}  // namespace
}  // namespace baton
