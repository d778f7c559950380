#include "standby/kv/kv_record.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace baton {
namespace {

constexpr int kBlockTokens = 8;

struct Block {
  std::vector<uint64_t> words = std::vector<uint64_t>(KvDataOffset(kBlockTokens) / 8 + 64, 0);
  uint8_t* data() { return reinterpret_cast<uint8_t*>(words.data()); }
  KvRecordRead Read() { return ReadKvRecord(data(), data() + kKvRecordHeaderBytes, kBlockTokens); }
  uint32_t& commit() { return reinterpret_cast<uint32_t*>(data())[1]; }
};

KvBlockRecord Record() {
  return {.identity = 0xABCD,
          .key = {0x1122334455667788ull, 0x99AABBCCDDEEFF00ull},
          .writer_epoch = 3,
          .block = 17,
          .prev_block = 16,
          .index = 1,
          .tokens = 5};
}

TEST(KvRecordTest, CommittedRecordReadsBack) {
  Block b;
  const std::vector<int32_t> ids = {5, 6, 7, 8, 9};
  CommitKvRecord(b.data(), Record(), ids);
  KvRecordRead r = b.Read();
  ASSERT_EQ(r.state, KvRecordState::kValid);
  EXPECT_EQ(r.ids, ids);
  EXPECT_EQ(r.record.key, Record().key);
  EXPECT_EQ(r.record.block, 17u);
  EXPECT_EQ(r.record.prev_block, 16u);
  EXPECT_EQ(r.record.index, 1u);
  EXPECT_EQ(r.record.tokens, 5u);
  EXPECT_EQ(r.record.writer_epoch, 3u);
  EXPECT_EQ(r.record.identity, 0xABCDu);
  EXPECT_EQ(b.commit() % 2, 0u);

  // A later step of the same block: the counter moves on, the record grows.
  const std::vector<int32_t> more = {5, 6, 7, 8, 9, 10, 11};
  KvBlockRecord later = Record();
  later.tokens = 7;
  const uint32_t before = b.commit();
  CommitKvRecord(b.data(), later, more);
  EXPECT_EQ(b.commit(), before + 2);
  EXPECT_EQ(b.Read().ids, more);
}

TEST(KvRecordTest, ClearedOrZeroBlockHasNoRecord) {
  Block b;
  EXPECT_EQ(b.Read().state, KvRecordState::kAbsent);
  CommitKvRecord(b.data(), Record(), std::vector<int32_t>{1, 2, 3, 4, 5});
  ClearKvRecord(b.data());
  EXPECT_EQ(b.Read().state, KvRecordState::kAbsent);
}

TEST(KvRecordTest, TornCommitIsTornButStillNamesItsRequest) {
  Block b;
  CommitKvRecord(b.data(), Record(), std::vector<int32_t>{1, 2, 3, 4, 5});
  b.commit() += 1;  // the writer died between the odd and the even store
  KvRecordRead r = b.Read();
  EXPECT_EQ(r.state, KvRecordState::kTorn);
  EXPECT_EQ(r.record.key, Record().key);
  EXPECT_TRUE(r.ids.empty());

  // The first commit of a fresh block that died before its end: stable fields, no magic.
  Block fresh;
  CommitKvRecord(fresh.data(), Record(), std::vector<int32_t>{1});
  std::memset(fresh.data(), 0, 4);  // magic
  EXPECT_EQ(fresh.Read().state, KvRecordState::kTorn);
}

TEST(KvRecordTest, ChangedIdsOrFieldsAreCorrupt) {
  Block b;
  CommitKvRecord(b.data(), Record(), std::vector<int32_t>{1, 2, 3, 4, 5});
  reinterpret_cast<int32_t*>(b.data() + kKvRecordHeaderBytes)[2] = 99;
  EXPECT_EQ(b.Read().state, KvRecordState::kCorrupt);

  Block c;
  CommitKvRecord(c.data(), Record(), std::vector<int32_t>{1, 2, 3, 4, 5});
  reinterpret_cast<uint32_t*>(c.data())[12] = 0;  // the index, under the checksum
  EXPECT_EQ(c.Read().state, KvRecordState::kCorrupt);

  Block d;  // more tokens than the reader's blocks have slots
  CommitKvRecord(d.data(), Record(), std::vector<int32_t>{1, 2, 3, 4, 5});
  EXPECT_EQ(ReadKvRecord(d.data(), d.data() + kKvRecordHeaderBytes, 4).state,
            KvRecordState::kCorrupt);
}

TEST(KvRecordTest, GeometryLeavesRoomForIdsAndData) {
  EXPECT_EQ(KvDataOffset(1), 128u);
  EXPECT_EQ(KvDataOffset(16), 128u);
  EXPECT_EQ(KvDataOffset(17), 192u);
  for (uint64_t per_token : {4u, 100u, 4096u}) {
    for (uint64_t block : {200u, 4096u, 65536u, 1u << 20}) {
      const int t = KvBlockTokensFor(block, per_token);
      if (t == 0) {
        EXPECT_GT(KvDataOffset(1) + per_token, block);
        continue;
      }
      EXPECT_LE(KvDataOffset(t) + t * per_token, block) << per_token << " " << block;
      EXPECT_GT(KvDataOffset(t + 1) + (t + 1) * per_token, block) << per_token << " " << block;
    }
  }
  EXPECT_EQ(KvBlockTokensFor(64, 4), 0);
  EXPECT_EQ(KvBlockTokensFor(4096, 0), 0);
}

TEST(KvRecordTest, RequestKeyHex) {
  const KvRequestKey key{0x0123456789abcdefull, 0xfedcba9876543210ull};
  EXPECT_EQ(key.ToHex(), "0123456789abcdeffedcba9876543210");
  EXPECT_EQ(KvRequestKey::FromHex(key.ToHex()), key);
  EXPECT_EQ(KvRequestKey::FromHex("0123456789ABCDEFFEDCBA9876543210"), key);
  EXPECT_FALSE(KvRequestKey::FromHex("0123").has_value());
  EXPECT_FALSE(KvRequestKey::FromHex("0123456789abcdeffedcba987654321g").has_value());
  EXPECT_FALSE(KvRequestKey::FromHex(std::string(32, '0')).has_value());
  EXPECT_NE(KvIdentityOf("a"), KvIdentityOf("b"));
}

}  // namespace
}  // namespace baton
