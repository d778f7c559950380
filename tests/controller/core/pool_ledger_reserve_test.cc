// PoolLedger's promotion reserve: free blocks (whole chunks on a device pool) held back from
// every grant, granted whole to a standby promoted while its predecessor's blocks are
// quarantined; those blocks move only past the barrier.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "controller/core/pool_ledger.h"
#include "tests/controller/core/pool_ledger_testutil.h"

namespace baton {
namespace {

using ledger_test::Blocks;
using ledger_test::CounterEpochs;

class ReserveTest : public ledger_test::LedgerFixture {
 protected:
  void Shape() override { ASSERT_TRUE(ledger_.SetPromotionReserve(4).ok()); }
};

TEST_F(ReserveTest, GrantsLeaveTheReserveFree) {
  EXPECT_EQ(ledger_.promotion_reserve(), 4u);
  EXPECT_EQ(ledger_.GrantableTo(1), 12u);
  Result<std::vector<Extent>> too_many = ledger_.Grant(1, 13, 1);
  EXPECT_EQ(too_many.status().code(), StatusCode::kResourceExhausted);
  ASSERT_TRUE(ledger_.Grant(1, 12, 1).ok());
  EXPECT_EQ(ledger_.ReserveAvailable(), 4u);
  EXPECT_EQ(ledger_.Snapshot().free_blocks, 4u);
  EXPECT_EQ(ledger_.GrantableTo(1), 0u);
}

TEST_F(ReserveTest, AStandbyPromotedBeforeTheBarrierStartsOnTheReserve) {
  Result<std::vector<Extent>> held = ledger_.Grant(1, 12, 1);
  ASSERT_TRUE(held.ok());
  ASSERT_TRUE(ledger_.Fence(1, *epochs_.Advance()).ok());  // its 12 blocks quarantined
  ASSERT_TRUE(ledger_.Promote(2, 2).ok());
  Result<std::vector<Extent>> reserve = ledger_.GrantReserve(2, 2);
  ASSERT_TRUE(reserve.ok()) << reserve.status().ToString();
  EXPECT_EQ(Blocks(*reserve), 4u);
  for (const Extent& x : *reserve) {
    for (const Extent& h : *held) EXPECT_TRUE(x.end() <= h.first || h.end() <= x.first);
  }
  EXPECT_TRUE(ledger_.CheckInvariants().ok()) << ledger_.CheckInvariants().ToString();
  EXPECT_EQ(ledger_.ReserveAvailable(), 0u) << "spent until blocks come back";
  EXPECT_FALSE(ledger_.GrantReserve(2, 2).ok());
  // Past the barrier, the quarantined blocks go to the new primary.
  Result<std::vector<Extent>> moved = ledger_.ReleaseAfterBarrier(1, 2);
  ASSERT_TRUE(moved.ok());
  EXPECT_EQ(Blocks(*moved), 12u);
  EXPECT_EQ(ledger_.engine(2)->blocks, 16u);
  // It gives four back: the reserve is whole again.
  ASSERT_TRUE(ledger_.Return(2, (*reserve)[0], 2).ok());
  EXPECT_EQ(ledger_.ReserveAvailable(), Blocks({(*reserve)[0]}));
}

TEST_F(ReserveTest, AReserveOfMoreThanHalfThePoolIsRefused) {
  const Status refused = ledger_.SetPromotionReserve(9);
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find("more than half the pool"), std::string::npos);
  EXPECT_EQ(ledger_.promotion_reserve(), 0u);
  EXPECT_EQ(ledger_.GrantableTo(1), 16u);
  EXPECT_FALSE(ledger_.GrantReserve(1, 1).ok());
}

TEST(ReserveChunks, TheReserveIsWholeChunksNobodyLeases) {
  CounterEpochs epochs;
  PoolLedger ledger(30, epochs);  // chunks of 4: the last one, [28, 30), is short
  ASSERT_TRUE(ledger.SetBlocksPerChunk(4).ok());
  ASSERT_TRUE(ledger.SetPromotionReserve(3).ok());
  EXPECT_EQ(ledger.promotion_reserve(), 4u) << "rounded up to a whole chunk";
  EXPECT_FALSE(ledger.SetPromotionReserve(16).ok()) << "four chunks are more than half of 30";
  ASSERT_TRUE(ledger.SetPromotionReserve(3).ok());
  ASSERT_TRUE(ledger.AddStandby(1).ok());
  ASSERT_TRUE(ledger.AddStandby(2).ok());
  ASSERT_TRUE(ledger.Promote(1, *epochs.Advance()).ok());
  // The short chunk and the one before it are held back: 6 blocks, at least the 4 asked.
  EXPECT_EQ(ledger.ReserveAvailable(), 6u);
  EXPECT_EQ(ledger.GrantableTo(1), 24u);
  ASSERT_TRUE(ledger.Grant(1, 23, 1).ok());  // a block of its last chunk stays beside it
  ASSERT_TRUE(ledger.Fence(1, *epochs.Advance()).ok());
  ASSERT_TRUE(ledger.Promote(2, 2).ok());
  Result<std::vector<Extent>> reserve = ledger.GrantReserve(2, 2);
  ASSERT_TRUE(reserve.ok()) << reserve.status().ToString();
  ASSERT_EQ(reserve->size(), 1u);
  EXPECT_EQ((*reserve)[0], (Extent{24, 6}));
  EXPECT_TRUE(ledger.CheckInvariants().ok()) << ledger.CheckInvariants().ToString();
}

// The deliberate fault: the reserve's grant also hands on a block still quarantined for the
// fenced engine's barrier. The ledger's check names rule 2.
TEST(ReserveMutation, HandingOnAQuarantinedBlockBreaksRule2) {
  CounterEpochs epochs;
  PoolLedger ledger(16, epochs);
  ledger.SetMutationForTesting(PoolLedger::Mutation::kHandOnQuarantined);
  ASSERT_TRUE(ledger.SetPromotionReserve(4).ok());
  ASSERT_TRUE(ledger.AddStandby(1).ok());
  ASSERT_TRUE(ledger.AddStandby(2).ok());
  ASSERT_TRUE(ledger.Promote(1, *epochs.Advance()).ok());
  ASSERT_TRUE(ledger.Grant(1, 12, 1).ok());
  ASSERT_TRUE(ledger.Fence(1, *epochs.Advance()).ok());
  ASSERT_TRUE(ledger.Promote(2, 2).ok());
  ASSERT_TRUE(ledger.GrantReserve(2, 2).ok());
  const Status status = ledger.CheckInvariants();
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.message().rfind("invariant 2", 0), 0u) << status.ToString();
}

}  // namespace
}  // namespace baton
