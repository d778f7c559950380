// Scenarios of a controller restart (scenario.h): the controller is killed and a new one
// starts from the roster and the journal while the engines run on. Each engine it finds
// either reattaches with what the roster says (re-adopted), reattaches with something the
// roster cannot account for (a stale epoch, blocks it was never granted: fenced), or never
// reattaches within readopt_timeout (fenced).
#include <algorithm>
#include <vector>

#include "tests/controller/core/scenario.h"

namespace baton::sim {
namespace {

using std::chrono::seconds;

class RestartScenario : public Scenario {
 protected:
  std::vector<Extent> LeasedTo(EngineId id) {
    std::vector<Extent> extents;
    for (const Lease& l : coord().ledger().LeasesOf(id)) extents.push_back(l.extent);
    return extents;
  }
};

// Both engines reattach consistent: each is acknowledged, nothing is killed, no epoch spent.
TEST_F(RestartScenario, EnginesThatReattachConsistentAreReadopted) {
  StartReadyPair();
  ControllerRestarts();
  WaitUntil([this] { return Ready(); }, seconds(2), "the pair to be re-adopted");
  ExpectEffects({Send(standby_, "ReattachAck"), Send(primary_, "ReattachAck")});
  ExpectNoEffect(E("Kill", primary_));
  ExpectNoEffect(E("Kill", standby_));
  ExpectNoEffect(EpochDurable(2));
  EXPECT_EQ(coord().primary(), primary_);
}

// After a failover the primary (engine 2) holds epoch 2; it reattaches claiming epoch 1. It is
// told to stop and fenced; the standby, re-adopted, is promoted at a new durable epoch with
// the fenced primary's blocks once it is past its barrier (a recovery moves no block before).
TEST_F(RestartScenario, PrimaryThatReattachesWithAStaleEpochIsFenced) {
  StartReadyPair();
  PrimaryDies();
  WaitUntil([this] { return Ready() && coord().primary() == standby_; }, seconds(3),
            "the failover");
  const EngineId primary = standby_, standby = StandbyId();
  loop_.world().Find(primary)->epoch = 1;
  journal_.clear();
  ControllerRestarts();
  WaitUntil([this, standby] { return Ready() && coord().primary() == standby; }, seconds(3),
            "the standby to serve");
  ExpectEffects({Send(primary, "Stop"), E("Kill", primary), E("BarrierPassed", primary),
                 E("Release", primary), EpochDurable(3), Send(standby, "Promote"), "PublishRoutes",
                 Launch(4, "standby")});
  ExpectEffects({Send(standby, "ReattachAck"), EpochDurable(3), Send(standby, "Promote")});
  ExpectNoEffect(Send(primary, "ReattachAck"));
}

// The primary reattaches claiming a block the roster never granted it: fenced as the stale
// one is, and the standby promoted.
TEST_F(RestartScenario, PrimaryThatClaimsBlocksItWasNeverGrantedIsFenced) {
  StartReadyPair();
  SimEngine& p = *loop_.world().Find(primary_);
  uint32_t free = 0;
  while (p.mapped.count(free) != 0) ++free;
  p.mapped.insert(free);
  ControllerRestarts();
  WaitUntil([this] { return Ready() && coord().primary() == standby_; }, seconds(3),
            "the standby to serve");
  ExpectEffects({Send(primary_, "Stop"), E("Kill", primary_), EpochDurable(2),
                 Send(standby_, "Promote"), "PublishRoutes", Launch(3, "standby")});
  ExpectNoEffect(Send(primary_, "ReattachAck"));
}

// The standby froze across the restart and never reattaches: once readopt_timeout has
// passed it is fenced and replaced; the primary, re-adopted, serves on at its epoch.
TEST_F(RestartScenario, StandbyThatNeverReattachesIsFencedAfterTheTimeout) {
  StartReadyPair();
  loop_.world().Hang(standby_);
  ControllerRestarts();
  Wait(loop_.config().readopt_timeout / 2);
  ExpectNoEffect(E("Kill", standby_));
  WaitUntil([this] { return Ready() && StandbyId() == 3; }, seconds(3), "a new standby");
  ExpectEffects({Send(primary_, "ReattachAck"), E("Kill", standby_), E("BarrierPassed", standby_),
                 E("Release", standby_), Launch(3, "standby"), Send(3, "RegisterAck")});
  ExpectNoEffect(EpochDurable(2));
  EXPECT_EQ(coord().primary(), primary_);
}

// The primary froze across the restart and never reattaches; the standby reattaches. At
// readopt_timeout the primary is fenced as unaccounted for: the pair is failing over (its
// standby is there), never down, and the standby is promoted once the primary's barrier
// passed.
TEST_F(RestartScenario, PrimaryThatNeverReattachesIsAFailoverNotAnOutage) {
  StartReadyPair();
  loop_.world().Hang(primary_);
  ControllerRestarts();
  std::vector<PairState> seen;
  WaitUntil(
      [&] {
        const PairState s = coord().pair_state();
        if (seen.empty() || seen.back() != s) seen.push_back(s);
        return Ready() && coord().primary() == standby_;
      },
      seconds(5), "the standby to serve");
  for (PairState s : seen) {
    EXPECT_NE(s, PairState::kDown) << "seen: " << ToString(s) << "\n" << Story();
  }
  ExpectEffects({Send(standby_, "ReattachAck"), E("Kill", primary_), E("BarrierPassed", primary_),
                 Send(standby_, "Promote")});
  const PromotionRecord* last = nullptr;
  const CoordinatorStatus status = coord().Snapshot();
  for (const PromotionRecord& r : status.timelines) last = &r;
  ASSERT_NE(last, nullptr);
  EXPECT_EQ(last->kind, PromotionKind::kFailover);
  EXPECT_EQ(last->old_engine, primary_);
  EXPECT_EQ(last->new_engine, standby_);
}

// The primary is killed, the standby promoted before its barrier and waiting for the old
// primary's quarantined blocks, and the controller is killed right after the Promote. Its
// successor re-adopts the promoted engine and, once the old primary is past its barrier, hands
// it those blocks as its predecessor would have: the engine adopts their KV in place and
// serves without waiting out its wait limit.
TEST_F(RestartScenario, EnginePromotedBeforeTheBarrierGetsTheQuarantinedBlocksAfterARestart) {
  loop_.world().inherit_waits = true;
  StartReadyPair();
  const std::vector<Extent> old_blocks = LeasedTo(primary_);
  ASSERT_FALSE(old_blocks.empty());
  PrimaryDies();
  while (Count(Send(standby_, "Promote")) == 0) loop_.RunFor(std::chrono::milliseconds(1));
  ASSERT_EQ(loop_.world().kv_stats.inherit_waited, 1u) << Story();
  ControllerRestarts();
  WaitUntil([this] { return Ready() && coord().primary() == standby_; }, seconds(3),
            "the promoted engine to serve");
  ExpectEffects({Send(standby_, "ReattachAck"), Send(standby_, "Grant")});
  ExpectEffects({E("BarrierPassed", primary_), Send(standby_, "Grant")});
  EXPECT_EQ(loop_.world().kv_stats.inherit_timed_out, 0u) << Story();
  const std::vector<Extent> now_held = LeasedTo(standby_);
  for (const Extent& x : old_blocks) {
    for (uint32_t b = x.first; b < x.end(); ++b) {
      EXPECT_TRUE(std::any_of(now_held.begin(), now_held.end(),
                              [b](const Extent& h) { return b >= h.first && b < h.end(); }))
          << "block " << b << " of the old primary is not the new primary's\n"
          << Story();
    }
  }
}

// The same kill, with a roster that does not say which blocks the fenced old primary held (one
// written by an older controller in its own recovery): the successor cannot hand them on, and
// tells the promoted engine so at once (an empty Quarantined), which replays their KV and
// serves rather than waiting out its limit; the blocks are freed once the old primary is gone.
TEST_F(RestartScenario, EnginePromotedBeforeTheBarrierIsToldAtOnceWhenItsBlocksAreUnaccounted) {
  loop_.world().inherit_waits = true;
  StartReadyPair();
  PrimaryDies();
  while (Count(Send(standby_, "Promote")) == 0) loop_.RunFor(std::chrono::milliseconds(1));
  ASSERT_EQ(loop_.world().kv_stats.inherit_waited, 1u) << Story();
  for (RosterEngine& r : loop_.mutable_disk().roster->engines) {
    if (r.id == primary_) r.extents.clear(), r.epoch = 0;
  }
  ControllerRestarts();
  WaitUntil([this] { return Ready() && coord().primary() == standby_; }, seconds(3),
            "the promoted engine to serve");
  ExpectEffects({Send(standby_, "ReattachAck"), Send(standby_, "Quarantined")});
  EXPECT_EQ(loop_.world().kv_stats.inherit_timed_out, 0u) << Story();
}

// The same kill, and the successor killed too before anything reattached: its roster keeps
// the blocks the fenced old primary held, so the third controller still hands them on.
TEST_F(RestartScenario, ASecondRestartStillKnowsTheOldPrimarysBlocks) {
  loop_.world().inherit_waits = true;
  StartReadyPair();
  PrimaryDies();
  while (Count(Send(standby_, "Promote")) == 0) loop_.RunFor(std::chrono::milliseconds(1));
  ControllerRestarts();
  ControllerRestarts();
  WaitUntil([this] { return Ready() && coord().primary() == standby_; }, seconds(3),
            "the promoted engine to serve");
  ExpectEffects({Send(standby_, "ReattachAck"), Send(standby_, "Grant")});
  EXPECT_EQ(Count(Send(standby_, "Quarantined")), 1u) << "only the first controller's";
  EXPECT_EQ(loop_.world().kv_stats.inherit_timed_out, 0u) << Story();
}

}  // namespace
}  // namespace baton::sim
