// Scenarios of a failing engine (scenario.h): a primary killed, a primary hung, a standby
// dead, and the operator's planned switch-over (`batonctl promote`), each told as the effects
// the Coordinator takes, in order.
#include "tests/controller/core/scenario.h"

namespace baton::sim {
namespace {

using std::chrono::seconds;

class FailoverScenario : public Scenario {
 protected:
  // A ready pair whose primary hangs, then its standby 50 ms later: their hang verdicts come
  // in different passes of the detectors.
  void ReadyPairWhoseStandbyHangsJustAfterThePrimary() {
    StartReadyPair();
    loop_.world().Hang(primary_);
    Wait(std::chrono::milliseconds(50));
    loop_.world().Hang(standby_);
  }
};

// kill -9 of the primary: its connection reaches EOF and its exit is reaped. It is fenced
// (Kill) before anything else; the new epoch is durable before the standby hears of it; the
// roster is written before the Promote; the standby is promoted on the reserve, told first
// which blocks are quarantined; the routes follow; once the dead primary is past its barrier
// its blocks are granted to the new primary, and a new standby is launched.
TEST_F(FailoverScenario, PrimaryKilledIsReplacedByTheStandby) {
  StartReadyPair();
  PrimaryDies();
  WaitUntil([this] { return Ready() && coord().primary() == standby_; }, seconds(3),
            "the standby to serve with a new standby beside it");
  ExpectEffects({E("Kill", primary_), EpochDurable(2), "SaveRoster", Send(standby_, "Quarantined"),
                 Send(standby_, "Promote"), "PublishRoutes", E("BarrierPassed", primary_),
                 Send(standby_, "Grant"), E("Release", primary_), Launch(3, "standby"),
                 Send(3, "RegisterAck"), "PublishRoutes"});
  EXPECT_EQ(Count(Send(standby_, "Promote")), 1u);
}

// A frozen primary: its heartbeats stop, the health probe goes unanswered, and only then is
// it killed as hung; the failover that follows is the one of a dead primary.
TEST_F(FailoverScenario, PrimaryHungIsConfirmedByAProbeThenReplaced) {
  StartReadyPair();
  PrimaryHangs();
  WaitUntil([this] { return Ready() && coord().primary() == standby_; }, seconds(3),
            "the standby to serve");
  ExpectEffects({Send(primary_, "HealthRequest"), E("Kill", primary_), EpochDurable(2),
                 "SaveRoster", Send(standby_, "Quarantined"), Send(standby_, "Promote"),
                 "PublishRoutes", E("BarrierPassed", primary_), Send(standby_, "Grant"),
                 Launch(3, "standby")});
}

// A primary whose compute hangs while its heartbeats go on: a router finds its streams
// standing still (EngineStalled) and the controller kills it as hung, with no health probe
// (it would answer); the failover follows. A stall reported of the standby changes nothing.
TEST_F(FailoverScenario, APrimaryARouterFindsStalledIsKilledAsHung) {
  StartReadyPair();
  coord().OnEngineStalled(standby_, "no byte on its 0 answering streams for 30000 ms");
  ExpectNoEffect(E("Kill", standby_));
  coord().OnEngineStalled(primary_, "no byte on its 3 answering streams for 30000 ms (router r)");
  WaitUntil([this] { return Ready() && coord().primary() == standby_; }, seconds(3),
            "the standby to serve");
  ExpectEffects({E("Kill", primary_), EpochDurable(2), "SaveRoster", Send(standby_, "Quarantined"),
                 Send(standby_, "Promote"), "PublishRoutes", E("BarrierPassed", primary_),
                 Launch(3, "standby")});
  ExpectNoEffect(Send(primary_, "HealthRequest"));
  coord().OnEngineStalled(primary_, "again");  // fenced already: nothing more
  EXPECT_EQ(Count(E("Kill", primary_)), 1u);
}

// A standby that dies holds no blocks: it is fenced and replaced, and no epoch is spent and
// nothing is promoted.
TEST_F(FailoverScenario, StandbyDeadIsReplacedWithoutANewEpoch) {
  StartReadyPair();
  StandbyDies();
  WaitUntil([this] { return Ready() && StandbyId() == 3; }, seconds(3), "a new standby");
  ExpectEffects({E("Kill", standby_), "PublishRoutes", Launch(3, "standby"), E("Release", standby_),
                 Send(3, "RegisterAck"), "PublishRoutes"});
  ExpectNoEffect(EpochDurable(2));
  ExpectNoEffect(Send(standby_, "Promote"));
  EXPECT_EQ(coord().primary(), primary_);
}

// `batonctl promote`: the primary is drained first (its requests finish), then fenced and the
// standby promoted as in a failover; a new standby is launched.
TEST_F(FailoverScenario, OperatorPromoteDrainsThePrimaryThenPromotesTheStandby) {
  StartReadyPair();
  ASSERT_TRUE(coord().RequestSwitchover().ok());
  WaitUntil([this] { return Ready() && coord().primary() == standby_; }, seconds(3),
            "the standby to serve");
  ExpectEffects({Send(primary_, "Drain"), "PublishRoutes", E("Kill", primary_), EpochDurable(2),
                 Send(standby_, "Quarantined"), Send(standby_, "Promote"), "PublishRoutes",
                 E("BarrierPassed", primary_), Send(standby_, "Grant"), Launch(3, "standby")});
}

// A standby that registers and never says it is ready (one connected with ready_when_waiting
// that never waits for its promotion) is killed at register_timeout_ms, and its fence reason
// says it registered.
TEST_F(FailoverScenario, AStandbyRegisteredButNeverReadyIsFencedForThat) {
  StartReadyPair();
  loop_.world().standbys_never_ready = true;
  StandbyDies();
  WaitUntil(
      [this] {
        const EngineRecord* r = coord().engine(3);
        return r != nullptr && !r->live();
      },
      seconds(3), "the new standby to be fenced");
  ExpectEffects({Launch(3, "standby"), Send(3, "RegisterAck"), E("Kill", 3)});
  const std::string reason = coord().engine(3)->fail_reason;
  EXPECT_NE(reason.find("registered but did not say it was ready"), std::string::npos) << reason;
  EXPECT_EQ(reason.find("did not register in time"), std::string::npos) << reason;
}

// A return whose second extent the primary does not hold: the first is taken back (free in
// the ledger, gone from the roster's record of the primary), the second refused with an
// ErrorMsg; the primary serves on.
TEST_F(FailoverScenario, AReturnWithABadExtentKeepsTheGoodOnesAccountedFor) {
  StartReadyPair();
  SimEngine& p = *loop_.world().Find(primary_);
  ASSERT_FALSE(p.mapped.empty());
  const uint32_t good = *p.mapped.begin();
  uint32_t bad = 0;
  while (p.mapped.count(bad) != 0) ++bad;
  const uint32_t held = coord().ledger().engine(primary_)->blocks;
  p.mapped.erase(good);
  loop_.world().Send(p, proto::ReturnExtents{.epoch = p.epoch, .extents = {{good, 1}, {bad, 1}}},
                     std::chrono::milliseconds(1));
  Wait(std::chrono::milliseconds(20));
  EXPECT_EQ(coord().ledger().engine(primary_)->blocks, held - 1);
  ExpectEffects({Send(primary_, "ErrorMsg")});
  ASSERT_TRUE(loop_.disk().roster.has_value());
  const RosterEngine* r = loop_.disk().roster->Find(primary_);
  ASSERT_NE(r, nullptr);
  for (const Extent& x : r->extents) {
    EXPECT_FALSE(x.first <= good && good < x.first + x.count) << "the roster still lists " << good;
  }
  EXPECT_EQ(coord().primary(), primary_);
}

// Both engines fall silent together (a host short of CPU stalls them both): neither is
// fenced at its first verdict; each is asked again, and both answer once the host is back.
TEST_F(FailoverScenario, EnginesSilentTogetherAreAskedAgainNotFenced) {
  StartReadyPair();
  loop_.world().Hang(primary_);
  loop_.world().Hang(standby_);
  Wait(std::chrono::milliseconds(450));  // past suspect_after (300) and a probe (100)
  loop_.world().Find(primary_)->hung = false;
  loop_.world().Find(standby_)->hung = false;
  Wait(std::chrono::milliseconds(500));
  ExpectNoEffect(E("Kill", primary_));
  ExpectNoEffect(E("Kill", standby_));
  EXPECT_EQ(coord().primary(), primary_);
  EXPECT_TRUE(Ready()) << Story();
}

// Both engines hang for good: after the probes more both are fenced, the standby first, so
// that the primary's fence promotes no engine about to be fenced.
TEST_F(FailoverScenario, EnginesHungTogetherAreFencedStandbyFirst) {
  StartReadyPair();
  loop_.world().Hang(primary_);
  loop_.world().Hang(standby_);
  WaitUntil([this] { return Count(E("Kill", primary_)) > 0; }, seconds(3), "the fence");
  ExpectEffects({E("Kill", standby_), E("Kill", primary_)});
  ExpectNoEffect(Send(standby_, "Promote"));
}

// The standby falls silent just after the primary (their verdicts in different passes): when
// the primary is fenced, the silent standby is not promoted; once it answers again it is.
TEST_F(FailoverScenario, ASilentStandbyIsPromotedOnlyOnceItAnswers) {
  ASSERT_NO_FATAL_FAILURE(ReadyPairWhoseStandbyHangsJustAfterThePrimary());
  WaitUntil([this] { return Count(E("Kill", primary_)) > 0; }, seconds(3), "the primary's fence");
  ExpectNoEffect(Send(standby_, "Promote"));
  ExpectNoEffect(E("Kill", standby_));
  loop_.world().Find(standby_)->hung = false;
  WaitUntil([this] { return Ready() && coord().primary() == standby_; }, seconds(3),
            "the standby, answering again, to be promoted");
  ExpectNoEffect(E("Kill", standby_));
}

// A standby that stays silent is fenced, never promoted.
TEST_F(FailoverScenario, AStandbySilentForGoodIsFencedNotPromoted) {
  ASSERT_NO_FATAL_FAILURE(ReadyPairWhoseStandbyHangsJustAfterThePrimary());
  WaitUntil([this] { return Count(E("Kill", standby_)) > 0; }, seconds(3), "the standby's fence");
  ExpectNoEffect(Send(standby_, "Promote"));
}

}  // namespace
}  // namespace baton::sim
