// Scenarios of the promotion reserve's refill (scenario.h): the standby is promoted on the
// reserve, the old primary's blocks follow it past the barrier, and the reserve is refilled by
// a Reclaim to the new primary. Each is told as the effects the Coordinator takes and the
// ledger's accounting after each step. The new primary's returns are played by the test
// (SimEngine::holds_reclaims), so that what it returns, and when, is the story's.
#include "tests/controller/core/scenario.h"

namespace baton::sim {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

class ReserveScenario : public Scenario {
 protected:
  // The primary dies and the standby, whose Reclaims the test answers, takes over, until the
  // reserve's Reclaim reaches it. Returns the blocks it asks.
  uint32_t FailOverUntilTheReserveIsAsked() {
    NewPrimary().holds_reclaims = true;
    PrimaryDies();
    WaitUntil([this] { return !NewPrimary().held_reclaims.empty(); }, seconds(3),
              "the reserve's Reclaim");
    return NewPrimary().held_reclaims.empty() ? 0 : NewPrimary().held_reclaims.back().blocks;
  }
  SimEngine& NewPrimary() { return *loop_.world().Find(standby_); }
  // The new primary returns its `blocks` highest blocks, and the return reaches the controller.
  void NewPrimaryReturns(uint32_t blocks) {
    loop_.world().GiveBack(NewPrimary(), blocks);
    Wait(milliseconds(30));  // sent with a delay of 20 ms at most
  }
  uint32_t ReserveHolds() { return coord().ledger().ReserveAvailable(); }
  // Every block is the primary's or the reserve's: no free block beside the reserve, none left
  // for nobody; and what the ledger lends the primary is what it maps.
  void ExpectNoBlockLeftForNobody() {
    const PoolLedger& ledger = coord().ledger();
    const LedgerSnapshot s = ledger.Snapshot();
    EXPECT_EQ(s.free_blocks + s.granted_blocks + s.quarantined_blocks, s.block_count);
    EXPECT_EQ(s.quarantined_blocks, 0u);
    EXPECT_EQ(s.free_blocks, ledger.ReserveAvailable()) << Story();
    EXPECT_EQ(ledger.GrantableTo(coord().primary()), 0u) << Story();
    const LedgerEngine* p = ledger.engine(coord().primary());
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(p->blocks, NewPrimary().mapped.size());
  }
};

// Simulation seed 3317105: a return is not marked as the answer to a Reclaim. Blocks the new
// primary gave up of its own, as many as the reserve's Reclaim asked and sent before it read
// the Reclaim, come first and are taken for the answer: they fill the reserve. Its answer
// comes after, within kReclaimAnswerTimeout of the Reclaim, and is taken for the answer too:
// the reserve being full, its blocks go back to the primary (once taken for blocks given up,
// they stayed free for nobody). Past kReclaimAnswerTimeout a return is blocks given up, which
// stay free.
TEST_F(ReserveScenario, AReturnAsLargeAsTheReclaimDoesNotStrandItsAnswer) {
  StartReadyPair();
  const uint32_t target = coord().ledger().promotion_reserve();
  ASSERT_GT(target, 0u);
  const uint32_t asked = FailOverUntilTheReserveIsAsked();
  ExpectEffects({E("Kill", primary_), Send(standby_, "Promote"), E("BarrierPassed", primary_),
                 Send(standby_, "Grant"), Send(standby_, "Reclaim")});
  EXPECT_EQ(asked, target) << "the whole reserve went into the promotion";
  EXPECT_EQ(ReserveHolds(), 0u);

  // 1. Blocks it gives up of its own accord, as many as asked: taken for the answer.
  NewPrimaryReturns(asked);
  EXPECT_EQ(ReserveHolds(), target);
  ExpectNoBlockLeftForNobody();

  // 2. The answer, within kReclaimAnswerTimeout: taken for the answer too, and granted back.
  const size_t grants = Count(Send(standby_, "Grant"));
  NewPrimaryReturns(asked);
  EXPECT_EQ(Count(Send(standby_, "Grant")), grants + 1) << Story();
  EXPECT_EQ(ReserveHolds(), target);
  ExpectNoBlockLeftForNobody();

  // 3. Past kReclaimAnswerTimeout, a return is blocks given up: they stay free, and the
  // reserve, full, is not asked again.
  Wait(CoordinatorState::kReclaimAnswerTimeout);
  NewPrimaryReturns(1);
  EXPECT_EQ(Count(Send(standby_, "Grant")), grants + 1) << Story();
  EXPECT_EQ(coord().ledger().GrantableTo(standby_), 1u);
  EXPECT_EQ(ReserveHolds(), target);
  EXPECT_EQ(Count(Send(standby_, "Reclaim")), 1u);
}

// A return short of what the reserve's Reclaim asked leaves the reserve short. The primary is
// not asked again at once (what it can spare may not make whole chunks), but a second after
// the first Reclaim it is, for the rest, and its answer fills the reserve.
TEST_F(ReserveScenario, AShortAnswerIsFollowedByAnotherReclaimLater) {
  StartReadyPair();
  const uint32_t target = coord().ledger().promotion_reserve();
  const uint32_t asked = FailOverUntilTheReserveIsAsked();
  const TimePoint asked_at = loop_.clock().Now();
  ASSERT_GE(asked, 2u);

  // 1. The answer brings one block fewer than asked.
  NewPrimaryReturns(asked - 1);
  EXPECT_EQ(ReserveHolds(), target - 1);
  ExpectNoBlockLeftForNobody();

  // 2. Not asked again within the second; asked for the rest after it.
  Wait(asked_at + milliseconds(900) - loop_.clock().Now());
  EXPECT_EQ(Count(Send(standby_, "Reclaim")), 1u) << Story();
  WaitUntil([this] { return NewPrimary().held_reclaims.size() == 2; }, milliseconds(200),
            "another Reclaim");
  EXPECT_EQ(Count(Send(standby_, "Reclaim")), 2u);
  EXPECT_EQ(NewPrimary().held_reclaims.back().blocks, 1u);

  // 3. Its answer fills the reserve.
  NewPrimaryReturns(1);
  EXPECT_EQ(ReserveHolds(), target);
  ExpectNoBlockLeftForNobody();
  Wait(seconds(2));
  EXPECT_EQ(Count(Send(standby_, "Reclaim")), 2u) << "the reserve is full: not asked again";
}

// A Reclaim the new primary ignores is asked again kReclaimAnswerTimeout after it was sent,
// with one WARN line that says so; not every tick in between.
TEST_F(ReserveScenario, AnIgnoredReclaimIsAskedAgainWithOneWarning) {
  StartReadyPair();
  const uint32_t asked = FailOverUntilTheReserveIsAsked();
  const TimePoint asked_at = loop_.clock().Now();
  ::testing::internal::CaptureStderr();
  Wait(asked_at + CoordinatorState::kReclaimAnswerTimeout - milliseconds(20) - loop_.clock().Now());
  const size_t before = Count(Send(standby_, "Reclaim"));
  WaitUntil([this] { return NewPrimary().held_reclaims.size() == 2; }, seconds(1),
            "the Reclaim asked again");
  Wait(seconds(2));
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(before, 1u);
  EXPECT_EQ(Count(Send(standby_, "Reclaim")), 2u) << Story();
  const std::string warn = "WARN controller: engine " + std::to_string(standby_) +
                           " (the primary) did not answer its Reclaim of " + std::to_string(asked) +
                           " blocks for the promotion reserve in ";
  EXPECT_EQ(Occurrences(log, warn), 1u) << log;
  EXPECT_NE(log.find(" ms: it is asked again\n"), std::string::npos) << log;
}

}  // namespace
}  // namespace baton::sim
