// PoolLedger on a device pool mapped by chunks: two holders (a primary and a canary) never
// get blocks of one chunk, and the invariant check names a chunk shared anyway.
#include <gtest/gtest.h>

#include <string>

#include "controller/core/pool_ledger.h"
#include "tests/controller/core/pool_ledger_testutil.h"

namespace baton {
namespace {

using ledger_test::CounterEpochs;

// 16 blocks in chunks of 4. Engine 1 is the primary at epoch 1, engine 2 the canary at 2.
class ChunkedLedgerTest : public ledger_test::LedgerFixture {
 protected:
  void Shape() override { ASSERT_TRUE(ledger_.SetBlocksPerChunk(4).ok()); }
  void SetUp() override {
    LedgerFixture::SetUp();
    ASSERT_TRUE(ledger_.Promote(2, *epochs_.Advance()).ok());
  }
};

TEST_F(ChunkedLedgerTest, AnEngineGetsNoBlockOfAChunkAnotherEngineHolds) {
  ASSERT_TRUE(ledger_.Grant(1, 6, 1).ok());  // [0, 6): chunk 0 and half of chunk 1
  EXPECT_EQ(ledger_.GrantableTo(1), 10u);
  EXPECT_EQ(ledger_.GrantableTo(2), 8u) << "blocks 6 and 7 share chunk 1 with engine 1";
  Result<std::vector<Extent>> too_many = ledger_.Grant(2, 10, 2);
  ASSERT_FALSE(too_many.ok());
  EXPECT_NE(too_many.status().message().find("8 in device pool chunks no other engine maps"),
            std::string::npos)
      << too_many.status().ToString();
  Result<std::vector<Extent>> canary = ledger_.Grant(2, 8, 2);
  ASSERT_TRUE(canary.ok()) << canary.status().ToString();
  ASSERT_EQ(canary->size(), 1u);
  EXPECT_EQ((*canary)[0], (Extent{8, 8}));
  EXPECT_EQ(ledger_.GrantableTo(2), 0u);
  Result<std::vector<Extent>> rest = ledger_.Grant(1, 2, 1);
  ASSERT_TRUE(rest.ok()) << rest.status().ToString();
  EXPECT_EQ((*rest)[0], (Extent{6, 2}));
}

TEST_F(ChunkedLedgerTest, AChunkIsFreeForOthersOnceItsLastBlockIsReturned) {
  ASSERT_TRUE(ledger_.Grant(1, 16, 1).ok());
  ASSERT_TRUE(ledger_.Return(1, Extent{4, 3}, 1).ok());
  EXPECT_EQ(ledger_.GrantableTo(2), 0u) << "block 7 keeps chunk 1 mapped by engine 1";
  EXPECT_EQ(ledger_.GrantableTo(1), 3u);
  ASSERT_TRUE(ledger_.Return(1, Extent{7, 1}, 1).ok());
  EXPECT_EQ(ledger_.GrantableTo(2), 4u);
  Result<std::vector<Extent>> canary = ledger_.Grant(2, 4, 2);
  ASSERT_TRUE(canary.ok()) << canary.status().ToString();
  EXPECT_EQ((*canary)[0], (Extent{4, 4}));
}

// Free blocks beside an engine's own are granted to it first, so whole free chunks stay
// free for another engine.
TEST_F(ChunkedLedgerTest, AGrantTakesBlocksBesideTheEnginesOwnFirst) {
  ASSERT_TRUE(ledger_.Grant(1, 10, 1).ok());             // [0, 10)
  ASSERT_TRUE(ledger_.Return(1, Extent{5, 3}, 1).ok());  // holds [0, 5) and [8, 10)
  EXPECT_EQ(ledger_.FreeBesideHeld(1), 5u);              // [5, 8) and [10, 12)
  EXPECT_EQ(ledger_.GrantableTo(2), 4u);                 // chunk 3 only
  Result<std::vector<Extent>> more = ledger_.Grant(1, 4, 1);
  ASSERT_TRUE(more.ok()) << more.status().ToString();
  EXPECT_EQ(*more, (std::vector<Extent>{{5, 3}, {10, 1}}));
  EXPECT_EQ(ledger_.GrantableTo(2), 4u) << "chunk 3 is still whole";
  EXPECT_EQ(ledger_.FreeBesideHeld(2), 0u);
}

TEST_F(ChunkedLedgerTest, QuarantinedBlocksKeepTheirChunkFromOthersUntilTheBarrier) {
  ASSERT_TRUE(ledger_.Grant(1, 2, 1).ok());  // [0, 2)
  ASSERT_TRUE(ledger_.Fence(1, *epochs_.Advance()).ok());
  EXPECT_EQ(ledger_.GrantableTo(2), 12u) << "engine 1 may still map chunk 0 until reaped";
  ASSERT_TRUE(ledger_.ReleaseAfterBarrier(1).ok());
  EXPECT_EQ(ledger_.GrantableTo(2), 16u);
}

TEST_F(ChunkedLedgerTest, APoolNotAMultipleOfTheChunkEndsInAShortChunk) {
  CounterEpochs epochs;
  PoolLedger ledger(10, epochs);
  ASSERT_TRUE(ledger.SetBlocksPerChunk(4).ok());
  ASSERT_TRUE(ledger.AddStandby(1).ok());
  ASSERT_TRUE(ledger.AddStandby(2).ok());
  ASSERT_TRUE(ledger.Promote(1, *epochs.Advance()).ok());
  ASSERT_TRUE(ledger.Promote(2, *epochs.Advance()).ok());
  ASSERT_TRUE(ledger.Grant(1, 9, 1).ok());
  EXPECT_EQ(ledger.GrantableTo(2), 0u);
  ASSERT_TRUE(ledger.Return(1, Extent{8, 1}, 1).ok());
  EXPECT_EQ(ledger.GrantableTo(2), 2u);
  EXPECT_TRUE(ledger.CheckInvariants().ok()) << ledger.CheckInvariants().ToString();
}

TEST(ChunkedLedgerCheckTest, AChunkSharedByTwoEnginesBreaksRuleOne) {
  CounterEpochs epochs;
  PoolLedger ledger(8, epochs);
  ASSERT_TRUE(ledger.AddStandby(1).ok());
  ASSERT_TRUE(ledger.AddStandby(2).ok());
  ASSERT_TRUE(ledger.Promote(1, *epochs.Advance()).ok());
  ASSERT_TRUE(ledger.Promote(2, *epochs.Advance()).ok());
  ASSERT_TRUE(ledger.Grant(1, 2, 1).ok());  // [0, 2)
  ASSERT_TRUE(ledger.Grant(2, 2, 2).ok());  // [2, 4): fine while blocks are mapped one by one
  EXPECT_TRUE(ledger.CheckInvariants().ok());
  ASSERT_TRUE(ledger.SetBlocksPerChunk(4).ok());
  const Status status = ledger.CheckInvariants();
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.message().rfind("invariant 1 (one writer per block): device pool chunk 0", 0),
            0u)
      << status.ToString();
  EXPECT_FALSE(ledger.SetBlocksPerChunk(0).ok());
  EXPECT_FALSE(ledger.AddStandby(UINT64_MAX - 1).ok()) << "reserved for the chunk check";
}

}  // namespace
}  // namespace baton
