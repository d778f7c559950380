// ChunkCover (which device-pool chunks an engine maps for the blocks it holds) and the pool's
// chunk size: pure bookkeeping, no GPU.
#include "cuda/memory/chunk_cover.h"

#include <gtest/gtest.h>

#include "cuda/device_owner.h"

namespace baton {
namespace {

using Spans = std::vector<ChunkSpan>;

TEST(ChunkCoverTest, MapsAChunkForItsFirstBlockAndUnmapsAfterItsLast) {
  Result<ChunkCover> made = ChunkCover::Create(/*block_count=*/10, /*blocks_per_chunk=*/4,
                                               /*chunk_count=*/3);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  ChunkCover c = std::move(made).value();
  EXPECT_EQ(*c.Add(2, 4), (Spans{{0, 2}}));  // blocks 2..5: chunks 0 and 1
  EXPECT_EQ(*c.Add(6, 1), Spans{}) << "chunk 1 is mapped already";
  EXPECT_EQ(*c.Add(9, 1), (Spans{{2, 1}}));  // the last, partly used chunk
  EXPECT_EQ(c.mapped_chunks(), 3u);
  EXPECT_EQ(c.held_blocks(), 6u);
  EXPECT_EQ(*c.Remove(2, 2), (Spans{{0, 1}}));
  EXPECT_EQ(*c.Remove(4, 2), Spans{}) << "block 6 keeps chunk 1";
  EXPECT_EQ(*c.Remove(6, 1), (Spans{{1, 1}}));
  EXPECT_EQ(*c.Remove(9, 1), (Spans{{2, 1}}));
  EXPECT_EQ(c.mapped_chunks(), 0u);
}

TEST(ChunkCoverTest, RefusesWhatTheLedgerWouldNeverGrant) {
  ChunkCover c = *ChunkCover::Create(8, 2, 4);
  ASSERT_TRUE(c.Add(0, 3).ok());
  EXPECT_EQ(c.Add(2, 1).status().code(), StatusCode::kFailedPrecondition) << "held twice";
  EXPECT_EQ(c.Remove(3, 1).status().code(), StatusCode::kFailedPrecondition) << "not held";
  EXPECT_EQ(c.Add(7, 2).status().code(), StatusCode::kInvalidArgument) << "past the pool";
  EXPECT_EQ(c.Add(0, 0).status().code(), StatusCode::kInvalidArgument) << "empty";
  EXPECT_EQ(c.held_blocks(), 3u) << "a refused call changes nothing";
  EXPECT_FALSE(ChunkCover::Create(8, 0, 4).ok());
  EXPECT_FALSE(ChunkCover::Create(9, 2, 4).ok()) << "4 chunks of 2 do not hold 9 blocks";
}

TEST(PoolChunkBytesTest, WholeBlocksWholeGranulesAtMostTheLimit) {
  constexpr uint64_t kMiB = 1 << 20;
  EXPECT_EQ(*PoolChunkBytes(2 * kMiB, 2 * kMiB, 1024 * kMiB, 256 * kMiB), 256 * kMiB);
  EXPECT_EQ(*PoolChunkBytes(3 * kMiB, 2 * kMiB, 1024 * kMiB, 256 * kMiB), 252 * kMiB);
  EXPECT_EQ(*PoolChunkBytes(64 * 1024, 2 * kMiB, 1024 * kMiB, 256 * kMiB), 256 * kMiB);
  EXPECT_EQ(*PoolChunkBytes(300 * kMiB, 2 * kMiB, 3000 * kMiB, 256 * kMiB), 300 * kMiB)
      << "a block larger than the limit is one chunk";
  EXPECT_EQ(*PoolChunkBytes(1 * kMiB, 2 * kMiB, 5 * kMiB, 256 * kMiB), 6 * kMiB)
      << "a small pool is one chunk";
  EXPECT_FALSE(PoolChunkBytes(0, 2 * kMiB, kMiB, kMiB).ok());
  EXPECT_FALSE(PoolChunkBytes(kMiB, 0, kMiB, kMiB).ok());
  EXPECT_FALSE(PoolChunkBytes(kMiB, kMiB, 0, kMiB).ok());
}

}  // namespace
}  // namespace baton
