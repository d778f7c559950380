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

// A dead predecessor's chunks read for a copy: only chunks without a held block are mapped
// READ, a grant in them makes them writable in place, and the rest are unmapped when dropped.
TEST(ChunkCoverTest, ChunksReadForACopyAreUpgradedByTheirGrantOrDropped) {
  ChunkCover c = *ChunkCover::Create(/*block_count=*/8, /*blocks_per_chunk=*/2, /*chunk_count=*/4);
  ASSERT_TRUE(c.Add(0, 2).ok());                    // chunk 0 held
  EXPECT_EQ(*c.AddReadOnly(1, 5), (Spans{{1, 2}}))  // blocks 1..5: chunks 0, 1, 2
      << "chunk 0 is mapped writable already";
  EXPECT_EQ(*c.AddReadOnly(2, 2), Spans{}) << "read already";
  EXPECT_EQ(c.read_only_chunks(), 2u);
  std::vector<ChunkSpan> upgraded;
  EXPECT_EQ(*c.Add(4, 1, &upgraded), Spans{}) << "chunk 2 is mapped, for reading";
  EXPECT_EQ(upgraded, (Spans{{2, 1}}));
  EXPECT_EQ(*c.Add(6, 1, &upgraded), (Spans{{3, 1}}));
  EXPECT_EQ(upgraded, Spans{});
  EXPECT_EQ(c.read_only_chunks(), 1u);
  EXPECT_EQ(c.DropReadOnly(), (Spans{{1, 1}})) << "chunk 2 is held now: it stays";
  EXPECT_EQ(c.DropReadOnly(), Spans{});
  EXPECT_EQ(*c.Remove(4, 1), (Spans{{2, 1}})) << "unmapped with its last held block";
  EXPECT_EQ(c.AddReadOnly(7, 2).status().code(), StatusCode::kInvalidArgument) << "past the pool";
  const Spans read = *c.AddReadOnly(2, 1);
  c.ForgetReadOnly(read);
  EXPECT_EQ(c.read_only_chunks(), 0u) << "a mapping that failed is not counted";
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
