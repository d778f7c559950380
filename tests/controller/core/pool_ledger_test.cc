#include "controller/core/pool_ledger.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/controller/core/pool_ledger_testutil.h"

namespace baton {
namespace {

using ledger_test::CounterEpochs;

void ExpectRefused(const Status& status, const std::string& fragment) {
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find(fragment), std::string::npos) << status.ToString();
}

void ExpectInvariant(const PoolLedger& ledger, int rule) {
  Status status = ledger.CheckInvariants();
  ASSERT_FALSE(status.ok()) << "expected invariant " << rule << " to fail";
  EXPECT_EQ(status.message().rfind("invariant " + std::to_string(rule), 0), 0u)
      << status.ToString();
}

// Engine 1 is the primary at epoch 1, engine 2 a standby.
class PoolLedgerTest : public ledger_test::LedgerFixture {};

TEST_F(PoolLedgerTest, GrantsContiguousBestFitAndCounts) {
  auto a = ledger_.Grant(1, 4, 1);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_EQ(a->size(), 1u);
  EXPECT_EQ((*a)[0], (Extent{0, 4}));
  auto b = ledger_.Grant(1, 3, 1);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ((*b)[0], (Extent{4, 3}));
  // Adjacent grants of one holder at one epoch merge into one lease.
  EXPECT_EQ(ledger_.LeasesOf(1).size(), 1u);
  LedgerSnapshot s = ledger_.Snapshot();
  EXPECT_EQ(s.granted_blocks, 7u);
  EXPECT_EQ(s.free_blocks, 9u);
  EXPECT_EQ(s.quarantined_blocks, 0u);
  EXPECT_EQ(ledger_.UsedBy(6), 1u);
  EXPECT_EQ(ledger_.UsedBy(7), kNoEngine);
  EXPECT_TRUE(ledger_.CheckMapWritable(1, Extent{2, 5}, 1).ok());
}

TEST_F(PoolLedgerTest, GrantIsAllOrNothingAndPrefersFewestExtents) {
  ASSERT_TRUE(ledger_.Grant(1, 16, 1).ok());
  // Free runs of 1, 2 and 3 blocks.
  ASSERT_TRUE(ledger_.Return(1, Extent{0, 1}, 1).ok());
  ASSERT_TRUE(ledger_.Return(1, Extent{4, 2}, 1).ok());
  ASSERT_TRUE(ledger_.Return(1, Extent{10, 3}, 1).ok());
  Status exhausted = ledger_.Grant(1, 7, 1).status();
  EXPECT_EQ(exhausted.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(ledger_.Snapshot().free_blocks, 6u);
  auto two = ledger_.Grant(1, 2, 1);  // best fit: the 2-block run
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(*two, (std::vector<Extent>{{4, 2}}));
  auto four = ledger_.Grant(1, 4, 1);  // largest runs first: 3 + 1
  ASSERT_TRUE(four.ok());
  EXPECT_EQ(*four, (std::vector<Extent>{{0, 1}, {10, 3}}));
}

TEST_F(PoolLedgerTest, StandbyMapsNothingWritable) {
  ExpectRefused(ledger_.Grant(2, 1, 0).status(), "maps nothing writable until promoted");
  EXPECT_TRUE(ledger_.CheckMessage(2, 0).ok());
  ExpectRefused(ledger_.CheckMessage(2, 1), "a standby holds no epoch");
  ExpectRefused(ledger_.CheckMapWritable(2, Extent{0, 1}, 0), "maps nothing writable");
}

TEST_F(PoolLedgerTest, ReturnChecksHolderEpochAndRange) {
  ASSERT_TRUE(ledger_.Grant(1, 8, 1).ok());
  ASSERT_TRUE(ledger_.Return(1, Extent{2, 3}, 1).ok());  // splits the lease
  EXPECT_EQ(ledger_.LeasesOf(1).size(), 2u);
  ExpectRefused(ledger_.Return(1, Extent{2, 1}, 1), "does not hold blocks [2, 3)");
  ExpectRefused(ledger_.Return(1, Extent{12, 1}, 1), "does not hold blocks [12, 13)");
  ExpectRefused(ledger_.Return(2, Extent{0, 1}, 0), "does not hold");
  ExpectRefused(ledger_.Return(1, Extent{15, 4}, 1), "outside the pool");
  ExpectRefused(ledger_.Return(1, Extent{0, 0}, 1), "outside the pool");
  ExpectRefused(ledger_.Return(1, Extent{0, 1}, 2), "from the future");
  EXPECT_EQ(ledger_.Return(9, Extent{0, 1}, 1).code(), StatusCode::kNotFound);
  EXPECT_EQ(ledger_.Snapshot().granted_blocks, 5u);
}

TEST_F(PoolLedgerTest, FenceQuarantinesUntilReleaseAfterBarrier) {
  ASSERT_TRUE(ledger_.Grant(1, 10, 1).ok());
  const uint64_t e2 = *epochs_.Advance();
  ASSERT_TRUE(ledger_.Fence(1, e2).ok());
  EXPECT_EQ(ledger_.Snapshot().quarantined_blocks, 10u);
  EXPECT_EQ(ledger_.UsedBy(0), kNoEngine);
  // Late messages from the fenced engine are refused and it is told to stop.
  ExpectRefused(ledger_.Return(1, Extent{0, 1}, 1), "fenced at epoch 2; stop");
  ExpectRefused(ledger_.CheckMessage(1, 1), "fenced");
  // The standby is promoted at the fence's epoch and gets only free blocks.
  ASSERT_TRUE(ledger_.Promote(2, e2).ok());
  ExpectRefused(ledger_.Grant(2, 7, e2).status(), "6 free");
  auto fresh = ledger_.Grant(2, 6, e2);
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(*fresh, (std::vector<Extent>{{10, 6}}));
  // After reap and barrier, the quarantined blocks go to the new holder at its epoch.
  auto moved = ledger_.ReleaseAfterBarrier(1, 2);
  ASSERT_TRUE(moved.ok()) << moved.status().ToString();
  EXPECT_EQ(*moved, (std::vector<Extent>{{0, 10}}));
  EXPECT_EQ(ledger_.UsedBy(0), 2u);
  EXPECT_TRUE(ledger_.CheckMapWritable(2, Extent{0, 16}, e2).ok());
  ExpectRefused(ledger_.CheckMessage(1, 1), "released");
}

TEST_F(PoolLedgerTest, ReleaseRequiresAFenceAndAHigherEpochHolder) {
  ExpectRefused(ledger_.ReleaseAfterBarrier(1).status(), "not fenced");
  ASSERT_TRUE(ledger_.Grant(1, 2, 1).ok());
  ASSERT_TRUE(ledger_.Fence(1, *epochs_.Advance()).ok());
  ExpectRefused(ledger_.ReleaseAfterBarrier(1, 2).status(), "not a holder");
  auto freed = ledger_.ReleaseAfterBarrier(1);
  ASSERT_TRUE(freed.ok());
  EXPECT_EQ(ledger_.Snapshot().free_blocks, 16u);
  EXPECT_EQ(ledger_.Snapshot().free_runs, 1u);
}

TEST_F(PoolLedgerTest, EpochsMustBeDurableAndNeverReused) {
  ExpectRefused(ledger_.Fence(1, 2), "not durable");
  ExpectRefused(ledger_.Fence(1, 1), "not above the issued epoch 1");
  ExpectRefused(ledger_.Promote(2, 1), "not above the issued epoch 1");
  ASSERT_TRUE(ledger_.Fence(1, *epochs_.Advance()).ok());  // reserves 2
  ASSERT_TRUE(ledger_.AddStandby(3).ok());
  ASSERT_TRUE(ledger_.Promote(2, 2).ok());
  ExpectRefused(ledger_.Promote(3, 2), "not above the issued epoch 2");
  ASSERT_TRUE(ledger_.ReleaseAfterBarrier(1).ok());
}

TEST_F(PoolLedgerTest, StandbyFenceRefusesLaterMessages) {
  ASSERT_TRUE(ledger_.FenceStandby(2).ok());
  ExpectRefused(ledger_.CheckMessage(2, 0), "engine 2 was fenced; stop");
  ExpectRefused(ledger_.Fence(2, 5), "not a holder");
  ASSERT_TRUE(ledger_.ReleaseAfterBarrier(2).ok());
  EXPECT_EQ(ledger_.engine(2)->role, LedgerRole::kReleased);
}

TEST_F(PoolLedgerTest, TombstonesArePruned) {
  for (EngineId id = 10; id < 210; ++id) {
    ASSERT_TRUE(ledger_.AddStandby(id).ok());
    ASSERT_TRUE(ledger_.FenceStandby(id).ok());
    ASSERT_TRUE(ledger_.ReleaseAfterBarrier(id).ok());
  }
  EXPECT_LE(ledger_.Snapshot().engines.size(), 64u + 2u);
  EXPECT_EQ(ledger_.CheckMessage(10, 0).code(), StatusCode::kNotFound);
  EXPECT_FALSE(ledger_.CheckMessage(209, 0).ok());
}

TEST(PoolLedgerRecoveryTest, ReadoptsIssuedEpochsAndFreesTheRestAfterRecovery) {
  CounterEpochs epochs(7);
  PoolLedger ledger = PoolLedger::Recovering(16, epochs);
  EXPECT_TRUE(ledger.recovering());
  EXPECT_EQ(ledger.Snapshot().quarantined_blocks, 16u);
  ASSERT_TRUE(ledger.CheckInvariants().ok());
  ExpectRefused(ledger.Readopt(5, 8, {{0, 2}}), "which no previous controller issued");
  ExpectRefused(ledger.Readopt(5, 0, {{0, 2}}), "which no previous controller issued");
  ExpectRefused(ledger.Readopt(5, 7, {{0, 2}, {1, 2}}), "overlap");
  ExpectRefused(ledger.Readopt(5, 7, {{15, 2}}), "outside the pool");
  ASSERT_TRUE(ledger.Readopt(5, 7, {{3, 2}, {8, 1}}).ok());
  ExpectRefused(ledger.Readopt(6, 7, {}), "already held by engine 5");
  ASSERT_TRUE(ledger.CheckInvariants().ok()) << ledger.CheckInvariants().ToString();
  EXPECT_EQ(ledger.Snapshot().granted_blocks, 3u);
  // Nothing else can be granted until recovery ends.
  EXPECT_EQ(ledger.Grant(5, 1, 7).status().code(), StatusCode::kResourceExhausted);
  ASSERT_TRUE(ledger.Return(5, Extent{8, 1}, 7).ok());
  ASSERT_TRUE(ledger.EndRecovery().ok());
  EXPECT_EQ(ledger.Snapshot().free_blocks, 14u);
  EXPECT_FALSE(ledger.recovering());
  ASSERT_TRUE(ledger.Grant(5, 14, 7).ok());
  ASSERT_TRUE(ledger.CheckInvariants().ok());
  ExpectRefused(ledger.Readopt(6, 7, {}), "not recovering");
}

// The blocks owed to a re-adopted holder (an old primary's, past its barrier) are granted to
// it at its epoch while the recovery runs: only those still unclaimed, never another holder's.
TEST(PoolLedgerRecoveryTest, UnclaimedBlocksGoToAReadoptedHolder) {
  CounterEpochs epochs(9);
  PoolLedger ledger = PoolLedger::Recovering(16, epochs);
  ASSERT_TRUE(ledger.Readopt(1, 9, {{0, 2}}).ok());
  ASSERT_TRUE(ledger.Readopt(2, 4, {{10, 2}}).ok());
  EXPECT_EQ(ledger.GrantUnclaimed(3, {{4, 2}}).status().code(), StatusCode::kFailedPrecondition);
  Result<std::vector<Extent>> moved = ledger.GrantUnclaimed(1, {{1, 5}, {9, 3}, {15, 4}});
  ASSERT_TRUE(moved.ok()) << moved.status().ToString();
  EXPECT_EQ(*moved, (std::vector<Extent>{{2, 4}, {9, 1}, {15, 1}}));
  EXPECT_EQ(ledger.engine(1)->blocks, 8u);
  EXPECT_EQ(ledger.engine(2)->blocks, 2u);
  ASSERT_TRUE(ledger.CheckInvariants().ok()) << ledger.CheckInvariants().ToString();
  // Extents given twice, or overlapping, are granted once.
  moved = ledger.GrantUnclaimed(1, {{12, 2}, {12, 2}, {13, 2}});
  ASSERT_TRUE(moved.ok()) << moved.status().ToString();
  EXPECT_EQ(*moved, (std::vector<Extent>{{12, 3}}));
  EXPECT_EQ(ledger.engine(1)->blocks, 11u);
  ASSERT_TRUE(ledger.CheckInvariants().ok()) << ledger.CheckInvariants().ToString();
  EXPECT_TRUE(ledger.CheckMessage(1, 9).ok());
  ASSERT_TRUE(ledger.EndRecovery().ok());
  EXPECT_EQ(ledger.Snapshot().free_blocks, 3u);
  EXPECT_EQ(ledger.GrantUnclaimed(1, {{12, 1}}).status().code(), StatusCode::kFailedPrecondition);
}

// A canary and a primary both outlive their controller: each is re-adopted at the epoch a
// previous controller gave it, below the new floor, and a fence later uses a fresh epoch.
TEST(PoolLedgerRecoveryTest, TwoHoldersAtOlderEpochsAreReadopted) {
  CounterEpochs epochs(64);
  PoolLedger ledger = PoolLedger::Recovering(16, epochs);
  ASSERT_TRUE(ledger.Readopt(1, 3, {{0, 8}}).ok());
  ASSERT_TRUE(ledger.Readopt(2, 5, {{8, 4}}).ok());
  ExpectRefused(ledger.Readopt(3, 5, {{12, 1}}), "already held by engine 2");
  ASSERT_TRUE(ledger.CheckInvariants().ok()) << ledger.CheckInvariants().ToString();
  EXPECT_TRUE(ledger.CheckMessage(1, 3).ok());
  EXPECT_FALSE(ledger.CheckMessage(1, 5).ok());
  ASSERT_TRUE(ledger.EndRecovery().ok());
  ASSERT_TRUE(ledger.Fence(2, *epochs.Advance()).ok());
  ASSERT_TRUE(ledger.ReleaseAfterBarrier(2).ok());
  ASSERT_TRUE(ledger.CheckInvariants().ok()) << ledger.CheckInvariants().ToString();
  EXPECT_EQ(ledger.Snapshot().free_blocks, 8u);
}

TEST(PoolLedgerRecoveryTest, NewPromotionsAfterRestartUseAFreshEpoch) {
  CounterEpochs epochs(4);
  PoolLedger ledger(8, epochs);
  ASSERT_TRUE(ledger.AddStandby(1).ok());
  ExpectRefused(ledger.Promote(1, 4), "not above the issued epoch 4");
  ASSERT_TRUE(ledger.Promote(1, *epochs.Advance()).ok());
}

// A canary: a second holder at a newer epoch next to the primary. Its blocks come from the
// primary's returns; when it is rolled back they go back to the older primary, but only once
// it is reaped and past the barrier.
TEST_F(PoolLedgerTest, ACanaryHoldsBlocksNextToThePrimaryAndGivesThemBack) {
  ASSERT_TRUE(ledger_.Grant(1, 16, 1).ok());
  ASSERT_TRUE(ledger_.Return(1, Extent{8, 8}, 1).ok());
  const uint64_t e2 = *epochs_.Advance();
  ASSERT_TRUE(ledger_.Promote(2, e2).ok());
  ASSERT_TRUE(ledger_.Grant(2, 8, e2).ok());
  EXPECT_TRUE(ledger_.CheckMessage(1, 1).ok()) << "the primary keeps its epoch";
  EXPECT_TRUE(ledger_.CheckMessage(2, e2).ok());
  EXPECT_TRUE(ledger_.CheckInvariants().ok()) << ledger_.CheckInvariants().ToString();

  ASSERT_TRUE(ledger_.Fence(2, *epochs_.Advance()).ok());  // rolled back
  ExpectRefused(ledger_.Grant(1, 1, 1).status(), "0 free");
  Result<std::vector<Extent>> freed = ledger_.ReleaseAfterBarrier(2);
  ASSERT_TRUE(freed.ok()) << freed.status().ToString();
  Result<std::vector<Extent>> back = ledger_.Grant(1, 8, 1);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(ledger_.engine(1)->blocks, 16u);
}

// Each deliberate fault is caught by CheckInvariants under the rule it breaks.
TEST(PoolLedgerMutationTest, SkippedQuarantineBreaksRule2) {
  CounterEpochs epochs;
  PoolLedger ledger(4, epochs);
  ledger.SetMutationForTesting(PoolLedger::Mutation::kSkipQuarantine);
  ASSERT_TRUE(ledger.AddStandby(1).ok());
  ASSERT_TRUE(ledger.AddStandby(2).ok());
  ASSERT_TRUE(ledger.Promote(1, *epochs.Advance()).ok());
  ASSERT_TRUE(ledger.Grant(1, 4, 1).ok());
  ASSERT_TRUE(ledger.Fence(1, *epochs.Advance()).ok());
  ASSERT_TRUE(ledger.Promote(2, 2).ok());
  ASSERT_TRUE(ledger.Grant(2, 4, 2).ok());  // the old holder is not reaped yet
  ExpectInvariant(ledger, 2);
}

TEST(PoolLedgerMutationTest, AcceptedStaleMessageBreaksRule4) {
  CounterEpochs epochs;
  PoolLedger ledger(4, epochs);
  ledger.SetMutationForTesting(PoolLedger::Mutation::kAcceptStale);
  ASSERT_TRUE(ledger.AddStandby(1).ok());
  ASSERT_TRUE(ledger.Promote(1, *epochs.Advance()).ok());
  ASSERT_TRUE(ledger.Grant(1, 2, 1).ok());
  ASSERT_TRUE(ledger.Fence(1, *epochs.Advance()).ok());
  ASSERT_TRUE(ledger.CheckMessage(1, 1).ok());
  ExpectInvariant(ledger, 4);
}

TEST(PoolLedgerMutationTest, GrantToStandbyBreaksRule5) {
  CounterEpochs epochs;
  PoolLedger ledger(4, epochs);
  ledger.SetMutationForTesting(PoolLedger::Mutation::kGrantToStandby);
  ASSERT_TRUE(ledger.AddStandby(1).ok());
  ASSERT_TRUE(ledger.Grant(1, 2, 0).ok());
  ExpectInvariant(ledger, 5);
}

}  // namespace
}  // namespace baton
