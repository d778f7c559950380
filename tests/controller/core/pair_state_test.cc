#include "controller/core/pair_state.h"

#include <gtest/gtest.h>

#include <set>
#include <utility>

namespace baton {
namespace {

using std::chrono::milliseconds;

template <typename S, typename E>
void ExpectApply(StateMachine<S, E>& machine, E event, S want) {
  Result<S> got = machine.Apply(event);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, want) << ToString(*got) << " != " << ToString(want);
}

TEST(StateTablesTest, EachStateEventPairHasAtMostOneRow) {
  std::set<std::pair<int, int>> engine_rows;
  for (const auto& row : EngineTable()) {
    EXPECT_TRUE(engine_rows.emplace(int(row.from), int(row.event)).second)
        << ToString(row.from) << " + " << ToString(row.event);
  }
  std::set<std::pair<int, int>> pair_rows;
  for (const auto& row : PairTable()) {
    EXPECT_TRUE(pair_rows.emplace(int(row.from), int(row.event)).second)
        << ToString(row.from) << " + " << ToString(row.event);
  }
}

TEST(StateTablesTest, DeadIsTerminalAndEveryLiveEngineStateCanBeFenced) {
  for (const auto& row : EngineTable()) EXPECT_NE(row.from, EngineState::kDead);
  for (EngineState s : {EngineState::kLaunching, EngineState::kStandby, EngineState::kPromoting,
                        EngineState::kPrimary, EngineState::kDraining}) {
    for (EngineEvent e : {EngineEvent::kDied, EngineEvent::kHungConfirmed,
                          EngineEvent::kErrorReported, EngineEvent::kFenceStarted}) {
      bool found = false;
      for (const auto& row : EngineTable()) {
        found |= row.from == s && row.event == e && row.to == EngineState::kFencing;
      }
      EXPECT_TRUE(found) << ToString(s) << " + " << ToString(e);
    }
  }
}

TEST(EngineMachineTest, LifeOfAPrimary) {
  FakeClock clock;
  EngineMachine engine = NewEngineMachine(7, clock);
  EXPECT_EQ(engine.state(), EngineState::kLaunching);
  EXPECT_FALSE(engine.Allows(EngineEvent::kRegistered)) << "StandbyReady before Register";
  ExpectApply(engine, EngineEvent::kRegisterAccepted, EngineState::kRegistering);
  ExpectApply(engine, EngineEvent::kRegistered, EngineState::kStandby);
  ExpectApply(engine, EngineEvent::kPromoteStarted, EngineState::kPromoting);
  ExpectApply(engine, EngineEvent::kPromoteDone, EngineState::kPrimary);
  ExpectApply(engine, EngineEvent::kHungConfirmed, EngineState::kFencing);
  ExpectApply(engine, EngineEvent::kDied, EngineState::kFencing);  // the SIGKILL landed
  ExpectApply(engine, EngineEvent::kFenceDone, EngineState::kDead);
  // Every change of state, and not the death that left it fencing.
  ASSERT_EQ(engine.history().size(), 6u);
  EXPECT_EQ(engine.history()[4].event, EngineEvent::kHungConfirmed);
  EXPECT_EQ(engine.history()[5].from, EngineState::kFencing);
  EXPECT_EQ(engine.history()[5].event, EngineEvent::kFenceDone);
}

TEST(EngineMachineTest, RefusedTransitionNamesMachineStateAndEvent) {
  FakeClock clock;
  EngineMachine engine = NewEngineMachine(3, clock);
  Result<EngineState> refused = engine.Apply(EngineEvent::kPromoteDone);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(refused.status().message(), "engine 3: promote_done is not allowed in state launching");
  EXPECT_EQ(engine.state(), EngineState::kLaunching);
  EXPECT_TRUE(engine.history().empty());
}

TEST(PairMachineTest, StartFailoverAndRecovery) {
  FakeClock clock;
  PairMachine pair = NewPairMachine("pair", clock);
  ExpectApply(pair, PairEvent::kStandbyReady, PairState::kStarting);
  ExpectApply(pair, PairEvent::kPromoteDone, PairState::kDegraded);
  ExpectApply(pair, PairEvent::kStandbyReady, PairState::kReady);
  ExpectApply(pair, PairEvent::kPrimaryHung, PairState::kFailingOver);
  ExpectApply(pair, PairEvent::kPromoteDone, PairState::kDegraded);
  ExpectApply(pair, PairEvent::kFenceDone, PairState::kDegraded);
  ExpectApply(pair, PairEvent::kStandbyReady, PairState::kReady);
  EXPECT_TRUE(PairServes(pair.state()));
}

TEST(PairMachineTest, GracefulPromotionNeedsAStandby) {
  FakeClock clock;
  PairMachine pair = NewPairMachine("pair", clock);
  ExpectApply(pair, PairEvent::kPromoteDone, PairState::kDegraded);
  Result<PairState> refused = pair.Apply(PairEvent::kGracefulPromoteRequested);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("state degraded"), std::string::npos);
  ExpectApply(pair, PairEvent::kStandbyReady, PairState::kReady);
  ExpectApply(pair, PairEvent::kGracefulPromoteRequested, PairState::kSwitchingOver);
  ExpectApply(pair, PairEvent::kDrained, PairState::kFailingOver);
  ExpectApply(pair, PairEvent::kPromoteDone, PairState::kDegraded);
}

TEST(PairMachineTest, ResumeUndoesADrainWhileDrainingOrOnceStopped) {
  FakeClock clock;
  PairMachine pair = NewPairMachine("pair", clock);
  ExpectApply(pair, PairEvent::kPromoteDone, PairState::kDegraded);
  ExpectApply(pair, PairEvent::kStandbyReady, PairState::kReady);
  EXPECT_FALSE(pair.Apply(PairEvent::kResume).ok()) << "nothing to resume in ready";
  ExpectApply(pair, PairEvent::kDrain, PairState::kDraining);
  ExpectApply(pair, PairEvent::kResume, PairState::kDegraded);  // the primary serves on
  ExpectApply(pair, PairEvent::kStandbyReady, PairState::kReady);
  ExpectApply(pair, PairEvent::kDrain, PairState::kDraining);
  ExpectApply(pair, PairEvent::kDrained, PairState::kStopped);
  ExpectApply(pair, PairEvent::kResume, PairState::kDown);  // a new pair starts
  ExpectApply(pair, PairEvent::kPromoteDone, PairState::kDegraded);
}

TEST(PairMachineTest, CrashLoopBackoffAndItsEnd) {
  FakeClock clock;
  PairMachine pair = NewPairMachine("pair", clock);
  ExpectApply(pair, PairEvent::kPromoteDone, PairState::kDegraded);
  ExpectApply(pair, PairEvent::kStandbyDied, PairState::kDegraded);
  ExpectApply(pair, PairEvent::kCrashLoopTripped, PairState::kDegradedBackoff);
  EXPECT_TRUE(PairServes(pair.state()));
  ExpectApply(pair, PairEvent::kPrimaryDied, PairState::kDownBackoff);
  EXPECT_FALSE(PairServes(pair.state()));
  ExpectApply(pair, PairEvent::kBackoffElapsed, PairState::kDown);
  ExpectApply(pair, PairEvent::kStandbyReady, PairState::kDown);
  ExpectApply(pair, PairEvent::kPromoteDone, PairState::kDegraded);
}

TEST(PairMachineTest, HistoryIsBoundedAndTimestamped) {
  FakeClock clock;
  PairMachine pair("pair", PairTable(), PairState::kStarting, clock, /*history_limit=*/4);
  ExpectApply(pair, PairEvent::kPromoteDone, PairState::kDegraded);
  for (int i = 0; i < 5; ++i) {
    clock.Advance(milliseconds(5));
    ExpectApply(pair, PairEvent::kStandbyReady, PairState::kReady);
    clock.Advance(milliseconds(5));
    ExpectApply(pair, PairEvent::kStandbyDied, PairState::kDegraded);
  }
  ASSERT_EQ(pair.history().size(), 4u);
  EXPECT_EQ(pair.history().back().at, clock.Now());
  EXPECT_EQ(pair.history().front().at, clock.Now() - milliseconds(15));
  EXPECT_EQ(pair.history().back().event, PairEvent::kStandbyDied);
}

// An event that leaves the state as it is (a fence done while degraded, a second report of
// the standby's death) is no change: status's transitions and the log show only changes.
TEST(PairMachineTest, AnEventThatChangesNothingIsNotRecorded) {
  FakeClock clock;
  PairMachine pair("pair", PairTable(), PairState::kStarting, clock);
  ExpectApply(pair, PairEvent::kPromoteDone, PairState::kDegraded);
  ExpectApply(pair, PairEvent::kStandbyDied, PairState::kDegraded);
  ExpectApply(pair, PairEvent::kFenceDone, PairState::kDegraded);
  ASSERT_EQ(pair.history().size(), 1u);
  EXPECT_EQ(pair.history().front().event, PairEvent::kPromoteDone);
}

TEST(PairMachineTest, DrainStops) {
  FakeClock clock;
  PairMachine pair = NewPairMachine("pair", clock);
  ExpectApply(pair, PairEvent::kPromoteDone, PairState::kDegraded);
  ExpectApply(pair, PairEvent::kDrain, PairState::kDraining);
  ExpectApply(pair, PairEvent::kDrained, PairState::kStopped);
  EXPECT_FALSE(pair.Allows(PairEvent::kPromoteDone));
}

}  // namespace
}  // namespace baton
