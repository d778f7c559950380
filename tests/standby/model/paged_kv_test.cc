#include "standby/model/paged_kv.h"

#include <gtest/gtest.h>

#include <set>
#include <vector>

namespace baton {
namespace {

constexpr KvLayout kLayout{2, 3, 4, 5};  // layers, kv_heads, head_dim, block_tokens

struct Blocks {
  explicit Blocks(size_t count) : memory(kLayout.block_bytes() / 4 * count) {}
  float* at(size_t i) { return memory.data() + i * (kLayout.block_bytes() / 4); }
  std::vector<float> memory;
};

PagedKvCache MakeCache(Blocks& blocks, size_t count) {
  Result<PagedKvCache> cache = PagedKvCache::Create(kLayout);
  EXPECT_TRUE(cache.ok());
  EXPECT_TRUE(cache->AddRegion(100, blocks.at(0), kLayout.block_bytes(), count).ok());
  return std::move(*cache);
}

TEST(PagedKvTest, LayoutRowsTileTheBlock) {
  EXPECT_EQ(kLayout.block_bytes(), 2u * 2 * 3 * 4 * 5 * 4);
  std::set<size_t> offsets;
  for (int l = 0; l < 2; ++l)
    for (int w = 0; w < 2; ++w)
      for (int h = 0; h < 3; ++h)
        for (int s = 0; s < 5; ++s) offsets.insert(kLayout.RowOffset(l, w, h, s));
  EXPECT_EQ(offsets.size(), 60u);
  EXPECT_EQ(*offsets.rbegin() + 4, kLayout.block_bytes() / 4);
  EXPECT_FALSE(PagedKvCache::Create({0, 1, 1, 1}).ok());
  EXPECT_FALSE(PagedKvCache::Create({1, 1, 1, -3}).ok());
}

TEST(PagedKvTest, AddBlockRefusesBadBlocks) {
  Blocks blocks(3);
  Result<PagedKvCache> cache = PagedKvCache::Create(kLayout);
  ASSERT_TRUE(cache.ok());
  const size_t bytes = kLayout.block_bytes();
  EXPECT_TRUE(cache->AddBlock(7, blocks.at(0), bytes).ok());
  EXPECT_FALSE(cache->AddBlock(7, blocks.at(1), bytes).ok());      // known id
  EXPECT_FALSE(cache->AddBlock(8, blocks.at(1), bytes - 4).ok());  // too small
  EXPECT_FALSE(cache->AddBlock(8, reinterpret_cast<uint8_t*>(blocks.at(1)) + 2, bytes).ok());
  EXPECT_FALSE(cache->AddBlock(PagedKvCache::kMaxBlockId + 1, blocks.at(1), bytes).ok());
  EXPECT_FALSE(cache->AddBlock(9, nullptr, bytes).ok());
  EXPECT_EQ(cache->total_blocks(), 1u);
}

TEST(PagedKvTest, ReserveGrowsReleaseReturns) {
  Blocks blocks(4);
  PagedKvCache cache = MakeCache(blocks, 4);
  KvSequence seq;
  ASSERT_TRUE(cache.Reserve(&seq, 6).ok());
  EXPECT_EQ(seq.blocks, (std::vector<KvBlockId>{100, 101}));
  ASSERT_TRUE(cache.Reserve(&seq, 10).ok());  // still two blocks
  EXPECT_EQ(seq.blocks.size(), 2u);
  ASSERT_TRUE(cache.Reserve(&seq, 11).ok());
  EXPECT_EQ(cache.free_blocks(), 1u);
  seq.length = 11;
  cache.Release(&seq);
  EXPECT_TRUE(seq.blocks.empty());
  EXPECT_EQ(seq.length, 0);
  EXPECT_EQ(cache.free_blocks(), 4u);
  cache.Release(&seq);  // releasing twice is harmless
  EXPECT_EQ(cache.free_blocks(), 4u);
}

TEST(PagedKvTest, RefusesWhenOutOfBlocksAllOrNothing) {
  Blocks blocks(3);
  PagedKvCache cache = MakeCache(blocks, 3);
  KvSequence a, b;
  ASSERT_TRUE(cache.Reserve(&a, 5).ok());
  Status s = cache.Reserve(&b, 11);  // needs 3, 2 free
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("3 blocks needed, 2 free of 3"), std::string::npos) << s.message();
  EXPECT_TRUE(b.blocks.empty());
  KvSequence* both[] = {&a, &b};
  const int64_t lengths[] = {10, 6};  // 1 + 2 more blocks
  EXPECT_EQ(cache.Reserve(both, lengths).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(a.blocks.size(), 1u);
  EXPECT_TRUE(b.blocks.empty());
  EXPECT_EQ(cache.free_blocks(), 2u);
  const int64_t fit[] = {10, 5};
  EXPECT_TRUE(cache.Reserve(both, fit).ok());
  EXPECT_EQ(cache.free_blocks(), 0u);
  cache.Release(&a);
  EXPECT_EQ(cache.free_blocks(), 2u);
  EXPECT_TRUE(cache.Reserve(&b, 15).ok());
}

TEST(PagedKvTest, RowsOfPositionsLandInTheirBlocks) {
  Blocks blocks(4);
  PagedKvCache cache = MakeCache(blocks, 3);
  KvSequence other, seq;
  ASSERT_TRUE(cache.Reserve(&other, 1).ok());  // so seq's blocks start at id 101
  ASSERT_TRUE(cache.Reserve(&seq, 10).ok());
  cache.Release(&other);
  ASSERT_TRUE(cache.Reserve(&seq, 15).ok());  // third block is the released 100
  EXPECT_EQ(seq.blocks, (std::vector<KvBlockId>{101, 102, 100}));
  for (int64_t pos = 0; pos < 15; ++pos) {
    float* row = cache.Row(seq, 1, 1, 2, pos);
    const size_t block = seq.blocks[pos / 5] - 100;
    EXPECT_EQ(row, blocks.at(block) + kLayout.RowOffset(1, 1, 2, static_cast<int>(pos % 5)));
  }
}

TEST(PagedKvTest, RemoveBlockOnlyWhenFree) {
  Blocks blocks(2);
  PagedKvCache cache = MakeCache(blocks, 2);
  KvSequence seq;
  ASSERT_TRUE(cache.Reserve(&seq, 1).ok());
  EXPECT_EQ(cache.RemoveBlock(100).code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(cache.RemoveBlock(101).ok());
  EXPECT_EQ(cache.RemoveBlock(101).code(), StatusCode::kNotFound);
  EXPECT_EQ(cache.total_blocks(), 1u);
  EXPECT_EQ(cache.Reserve(&seq, 6).code(), StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace baton
