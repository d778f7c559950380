#include "controller/core/canary.h"

#include <gtest/gtest.h>

#include "controller/upgrade/ctl_upgrade.h"

namespace baton {
namespace {

using Verdict = CanaryJudge::Verdict;
using std::chrono::milliseconds;

constexpr uint64_t kPrimary = 1;
constexpr uint64_t kCanary = 2;

CanaryPolicy Policy() {
  CanaryPolicy p;
  p.steps = {10, 50, 100};
  p.step_duration = milliseconds(1000);
  p.min_requests = 10;
  p.max_error_rate_excess = 0.05;
  p.max_latency_ratio = 2.0;
  return p;
}

// Policy() with one step, 100 %: the primary gets no request while the canary runs.
CanaryPolicy LastStepOnly() {
  CanaryPolicy p = Policy();
  p.steps = {100};
  return p;
}

// Adds `n` attempts to `engine`: `errors` of them failed, the rest took `ms` each.
void Add(OutcomeMap* m, uint64_t engine, uint64_t n, uint64_t errors, uint64_t ms) {
  proto::EngineOutcome& o = (*m)[engine];
  o.engine_id = engine;
  o.requests += n;
  o.errors += errors;
  o.succeeded += n - errors;
  o.duration_ms += (n - errors) * ms;
}

TEST(CanaryPolicyTest, StepsMustRiseToOneHundred) {
  EXPECT_TRUE(ParseCanarySteps("10,50,100").ok());
  EXPECT_TRUE(ParseCanarySteps("100").ok());
  EXPECT_FALSE(ParseCanarySteps("10,50").ok());      // never reaches 100
  EXPECT_FALSE(ParseCanarySteps("50,10,100").ok());  // falls
  EXPECT_FALSE(ParseCanarySteps("0,100").ok());      // 0 is no step
  EXPECT_FALSE(ParseCanarySteps("10,,100").ok());    // empty item
  EXPECT_FALSE(ParseCanarySteps("10,x,100").ok());
  EXPECT_FALSE(ParseCanarySteps("").ok());
  Result<std::vector<uint32_t>> steps = ParseCanarySteps("5,25,100");
  ASSERT_TRUE(steps.ok());
  EXPECT_EQ(*steps, (std::vector<uint32_t>{5, 25, 100}));
  CanaryPolicy p = Policy();
  p.max_latency_ratio = 0.5;
  EXPECT_FALSE(ValidateCanaryPolicy(p).ok());
}

TEST(CanaryJudgeTest, WalksEveryStepThenPromotes) {
  FakeClock clock;
  OutcomeMap m;
  CanaryJudge judge(clock, Policy(), kPrimary, kCanary, m);
  EXPECT_EQ(judge.weight(), 10u);
  EXPECT_EQ(judge.Judge(m).verdict, Verdict::kHold) << "no traffic yet";
  Add(&m, kCanary, 10, 0, 5);
  Add(&m, kPrimary, 90, 0, 5);
  EXPECT_EQ(judge.Judge(m).verdict, Verdict::kHold) << "the step's time is not up";
  clock.Advance(milliseconds(1000));
  EXPECT_EQ(judge.Judge(m).verdict, Verdict::kAdvance);
  judge.Advance(m);
  EXPECT_EQ(judge.weight(), 50u);
  clock.Advance(milliseconds(5000));
  CanaryJudge::Judgement j = judge.Judge(m);
  EXPECT_EQ(j.verdict, Verdict::kHold) << "the new step has seen no request of its own";
  EXPECT_NE(j.reason.find("0 of 10"), std::string::npos) << j.reason;
  Add(&m, kCanary, 10, 0, 5);
  EXPECT_EQ(judge.Judge(m).verdict, Verdict::kAdvance);
  judge.Advance(m);
  EXPECT_TRUE(judge.last_step());
  Add(&m, kCanary, 10, 0, 5);
  EXPECT_EQ(judge.Judge(m).verdict, Verdict::kHold);
  clock.Advance(milliseconds(1000));
  EXPECT_EQ(judge.Judge(m).verdict, Verdict::kPromote);
}

TEST(CanaryJudgeTest, ErrorsAboveThePrimarysRollBack) {
  FakeClock clock;
  OutcomeMap m;
  Add(&m, kPrimary, 1000, 0, 5);  // before the canary: not counted
  CanaryJudge judge(clock, Policy(), kPrimary, kCanary, m);
  Add(&m, kCanary, 9, 9, 0);
  EXPECT_EQ(judge.Judge(m).verdict, Verdict::kHold) << "9 attempts are below min_requests";
  Add(&m, kCanary, 1, 0, 5);
  Add(&m, kPrimary, 90, 0, 5);
  const CanaryJudge::Judgement j = judge.Judge(m);
  EXPECT_EQ(j.verdict, Verdict::kRollback);
  EXPECT_NE(j.reason.find("9 of 10"), std::string::npos) << j.reason;
}

TEST(CanaryJudgeTest, ErrorsNoWorseThanThePrimarysPass) {
  FakeClock clock;
  OutcomeMap m;
  CanaryJudge judge(clock, Policy(), kPrimary, kCanary, m);
  Add(&m, kPrimary, 100, 20, 5);  // the backend itself fails 20 %
  Add(&m, kCanary, 20, 5, 5);     // 25 %: within +5 points
  clock.Advance(milliseconds(1000));
  EXPECT_EQ(judge.Judge(m).verdict, Verdict::kAdvance);
  Add(&m, kCanary, 20, 6, 5);  // 11 of 40: 27.5 %, beyond 25 %
  EXPECT_EQ(judge.Judge(m).verdict, Verdict::kRollback);
}

TEST(CanaryJudgeTest, SlowCanaryRollsBack) {
  FakeClock clock;
  OutcomeMap m;
  CanaryPolicy p = Policy();
  p.latency_warmup_requests = 0;
  CanaryJudge judge(clock, p, kPrimary, kCanary, m);
  Add(&m, kPrimary, 50, 0, 40);
  Add(&m, kCanary, 10, 0, 79);  // within 2x
  clock.Advance(milliseconds(1000));
  EXPECT_EQ(judge.Judge(m).verdict, Verdict::kAdvance);
  Add(&m, kCanary, 10, 0, 200);  // mean 139.5 ms against 40 ms
  const CanaryJudge::Judgement j = judge.Judge(m);
  EXPECT_EQ(j.verdict, Verdict::kRollback);
  EXPECT_NE(j.reason.find("mean request duration"), std::string::npos) << j.reason;
}

// A new engine's first requests are slow (compilation, cold caches): they are not judged.
// Latency counts, on both sides, from the judgement that saw the warm-up done.
TEST(CanaryJudgeTest, WarmUpRequestsAreNotJudgedForLatency) {
  FakeClock clock;
  OutcomeMap m;
  CanaryPolicy p = Policy();
  p.latency_warmup_requests = 10;
  CanaryJudge judge(clock, p, kPrimary, kCanary, m);
  Add(&m, kPrimary, 50, 0, 4);
  Add(&m, kCanary, 9, 0, 50);  // still warming up
  EXPECT_EQ(judge.Judge(m).verdict, Verdict::kHold);
  Add(&m, kCanary, 3, 0, 50);  // 12: this judgement ends the warm-up
  clock.Advance(milliseconds(1000));
  EXPECT_EQ(judge.Judge(m).verdict, Verdict::kAdvance) << "12 slow requests, all warm-up";
  judge.Advance(m);
  Add(&m, kPrimary, 10, 0, 4);
  Add(&m, kCanary, 10, 0, 6);  // 6 ms against 4 ms since the warm-up: within 2x
  EXPECT_EQ(judge.Judge(m).verdict, Verdict::kHold);
  Add(&m, kPrimary, 10, 0, 4);
  Add(&m, kCanary, 10, 0, 20);  // mean 13 ms against 4 ms
  const CanaryJudge::Judgement j = judge.Judge(m);
  EXPECT_EQ(j.verdict, Verdict::kRollback);
  EXPECT_NE(j.reason.find("mean request duration 13.0 ms on the canary against 4.0 ms"),
            std::string::npos)
      << j.reason;
  EXPECT_NE(j.reason.find("the canary's after its first 10 requests, the primary's over the same"),
            std::string::npos)
      << j.reason;
}

// The 100 % step sends the primary nothing: a canary much slower than the primary was before
// is still caught there, against the primary's requests since the canary started or before it.
TEST(CanaryJudgeTest, ASlowCanaryIsCaughtAtTheLastStepAgainstThePrimarysEarlierRequests) {
  for (const bool before : {false, true}) {
    FakeClock clock;
    OutcomeMap m;
    const CanaryPolicy p = LastStepOnly();
    if (before) Add(&m, kPrimary, 50, 0, 40);  // served before the canary started
    CanaryJudge judge(clock, p, kPrimary, kCanary, m);
    if (!before) Add(&m, kPrimary, 10, 0, 40);  // before the router moved all traffic
    Add(&m, kCanary, 10, 0, 2600);              // the warm-up
    EXPECT_EQ(judge.Judge(m).verdict, Verdict::kHold);
    Add(&m, kCanary, 10, 0, 2600);
    clock.Advance(milliseconds(1000));
    const CanaryJudge::Judgement j = judge.Judge(m);
    EXPECT_EQ(j.verdict, Verdict::kRollback) << before << ": " << j.reason;
    EXPECT_NE(j.reason.find(before ? "before the canary started" : "since the canary started"),
              std::string::npos)
        << j.reason;
  }
}

// Without any request of the primary's to compare with, the last step holds, for at most
// kUnjudgedLatencySteps step durations: then it is promoted, saying latency was not judged.
TEST(CanaryJudgeTest, NoLatencyEvidenceHoldsTheLastStep) {
  for (const bool primary_comes : {true, false}) {
    FakeClock clock;
    OutcomeMap m;
    const CanaryPolicy p = LastStepOnly();
    CanaryJudge judge(clock, p, kPrimary, kCanary, m);
    Add(&m, kCanary, 30, 0, 5);
    clock.Advance(milliseconds(1000));
    CanaryJudge::Judgement j = judge.Judge(m);
    EXPECT_EQ(j.verdict, Verdict::kHold);
    EXPECT_NE(j.reason.find("no latency evidence"), std::string::npos) << j.reason;
    if (primary_comes) {
      Add(&m, kPrimary, 10, 0, 5);  // e.g. a router still sending it its share
      Add(&m, kCanary, 10, 0, 5);   // past the warm-up, which the first judgement saw
      j = judge.Judge(m);
      EXPECT_EQ(j.verdict, Verdict::kPromote);
      EXPECT_EQ(j.reason, "") << "judged";
      continue;
    }
    clock.Advance(milliseconds(5000));
    EXPECT_EQ(judge.Judge(m).verdict, Verdict::kHold)
        << "the canary itself has no request after its warm-up: it is never promoted so";
    Add(&m, kCanary, 10, 0, 5);
    EXPECT_EQ(judge.Judge(m).verdict, Verdict::kPromote)
        << "the canary has its requests, the primary none, the wait long past";
    EXPECT_NE(judge.Judge(m).reason.find("latency not judged"), std::string::npos);
  }
}

TEST(CanaryJudgeTest, OneDisagreementRollsBackByDefault) {
  FakeClock clock;
  OutcomeMap m;
  CanaryJudge judge(clock, Policy(), kPrimary, kCanary, m);
  m[kCanary].compared = 3;
  EXPECT_EQ(judge.Judge(m).verdict, Verdict::kHold);
  m[kCanary].disagreed = 1;
  const CanaryJudge::Judgement j = judge.Judge(m);
  EXPECT_EQ(j.verdict, Verdict::kRollback) << "even before min_requests attempts";
  EXPECT_NE(j.reason.find("outputs differ from the primary's on 1 of 3"), std::string::npos)
      << j.reason;
}

TEST(CanaryJudgeTest, ADisagreementRateIsJudgedFromMinRequestsOn) {
  FakeClock clock;
  OutcomeMap m;
  CanaryPolicy p = Policy();
  p.max_disagreement_rate = 0.1;
  CanaryJudge judge(clock, p, kPrimary, kCanary, m);
  m[kCanary].compared = 5;
  m[kCanary].disagreed = 2;  // 40 %, but only 5 of 10 comparisons
  EXPECT_EQ(judge.Judge(m).verdict, Verdict::kHold);
  m[kCanary].compared = 20;  // 10 %: at the limit
  EXPECT_EQ(judge.Judge(m).verdict, Verdict::kHold);
  m[kCanary].disagreed = 3;  // 15 %
  EXPECT_EQ(judge.Judge(m).verdict, Verdict::kRollback);
}

TEST(CanaryJudgeTest, SubMillisecondMeansNeverDecide) {
  FakeClock clock;
  OutcomeMap m;
  CanaryJudge judge(clock, Policy(), kPrimary, kCanary, m);
  Add(&m, kPrimary, 50, 0, 0);  // sub-millisecond requests sum to 0 ms
  Add(&m, kCanary, 10, 0, 1);
  clock.Advance(milliseconds(1000));
  EXPECT_EQ(judge.Judge(m).verdict, Verdict::kAdvance);
}

TEST(CanaryJudgeTest, ARestartedRouterNeverCountsBelowNothing) {
  FakeClock clock;
  OutcomeMap m;
  Add(&m, kCanary, 100, 0, 5);
  CanaryJudge judge(clock, Policy(), kPrimary, kCanary, m);
  OutcomeMap restarted;
  Add(&restarted, kCanary, 3, 3, 0);
  EXPECT_EQ(judge.Seen(kCanary, restarted).requests, 0u);
  EXPECT_EQ(judge.Judge(restarted).verdict, Verdict::kHold);
}

// A router forgets an engine no route table has listed for its retention (router/canary/
// engine_outcomes.h): an earlier primary leaves the sums while a canary is judged. The
// canary and its primary are listed, so they stay, and the verdicts do not move.
TEST(CanaryJudgeTest, AnEngineLeavingTheReportsChangesNoVerdict) {
  constexpr uint64_t kEarlierPrimary = 7;
  FakeClock clock;
  OutcomeMap with;
  Add(&with, kEarlierPrimary, 500, 200, 900);
  Add(&with, kPrimary, 50, 0, 5);
  CanaryJudge judge(clock, Policy(), kPrimary, kCanary, with);
  Add(&with, kPrimary, 20, 0, 5);
  Add(&with, kCanary, 20, 0, 5);
  OutcomeMap pruned = with;
  pruned.erase(kEarlierPrimary);
  clock.Advance(milliseconds(1000));
  EXPECT_EQ(judge.Seen(kCanary, pruned), judge.Seen(kCanary, with));
  EXPECT_EQ(judge.Seen(kPrimary, pruned), judge.Seen(kPrimary, with));
  EXPECT_EQ(judge.Judge(pruned).verdict, Verdict::kAdvance);
  judge.Advance(pruned);
  Add(&pruned, kCanary, 3, 3, 0);  // errors on the canary are still seen after the prune
  Add(&pruned, kPrimary, 3, 0, 5);
  EXPECT_EQ(judge.Seen(kCanary, pruned).errors, 3u);
}

TEST(UpgradeArgsTest, ParsesOptionsAndTheCommand) {
  Result<UpgradeRequest> r = ParseUpgradeArgs(
      {"--steps", "20,100", "--step-ms", "500", "--min-requests", "3", "--", "eng", "--x", "1"});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->command, (std::vector<std::string>{"eng", "--x", "1"}));
  EXPECT_EQ(*r->steps, (std::vector<uint32_t>{20, 100}));
  EXPECT_EQ(*r->step_duration, milliseconds(500));
  EXPECT_EQ(*r->min_requests, 3u);
  r = ParseUpgradeArgs({"--engine-cmd", "eng --name 'a b'"});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->command, (std::vector<std::string>{"eng", "--name", "a b"}));
  EXPECT_FALSE(r->steps.has_value());
  EXPECT_FALSE(ParseUpgradeArgs({}).ok());                     // no command
  EXPECT_FALSE(ParseUpgradeArgs({"--steps", "20,100"}).ok());  // no command
  EXPECT_FALSE(ParseUpgradeArgs({"--steps", "100,20", "--", "e"}).ok());
  EXPECT_FALSE(ParseUpgradeArgs({"--min-requests", "0", "--", "e"}).ok());
  EXPECT_FALSE(ParseUpgradeArgs({"--step-ms", "soon", "--", "e"}).ok());
  EXPECT_FALSE(ParseUpgradeArgs({"--frob", "1", "--", "e"}).ok());
  EXPECT_FALSE(ParseUpgradeArgs({"--step-ms"}).ok());  // no value
  const Result<UpgradeRequest> twice =
      ParseUpgradeArgs({"--engine-cmd", "/bin/true", "--", "/bin/false"});  // which one?
  EXPECT_EQ(twice.status().code(), StatusCode::kInvalidArgument) << twice.status().ToString();
  // Past a day (as upgrade.step_duration_ms); 2^64/1000 ms would wrap in the clock's math.
  EXPECT_TRUE(ParseUpgradeArgs({"--step-ms", "86400000", "--", "e"}).ok());
  EXPECT_FALSE(ParseUpgradeArgs({"--step-ms", "86400001", "--", "e"}).ok());
  EXPECT_FALSE(ParseUpgradeArgs({"--step-ms", "18446744073710", "--", "e"}).ok());
  // A command the record cannot keep byte for byte (JSON is UTF-8) is refused here, where a
  // refusal is an answer to the operator, not later when the controller saves it.
  Result<UpgradeRequest> latin1 = ParseUpgradeArgs({"--", "/opt/eng", "--name", "caf\xE9"});
  ASSERT_FALSE(latin1.ok());
  EXPECT_NE(latin1.status().message().find("word 3 is not valid UTF-8"), std::string::npos)
      << latin1.status().ToString();
  EXPECT_FALSE(ParseUpgradeArgs({"--engine-cmd", "eng \xFF"}).ok());
  // A placeholder no launch fills in is refused here, not by the canary's engine.
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"--", "/opt/eng", "--port", "{bogus}"}, {"--engine-cmd", "/opt/eng --x={bogus}"}}) {
    Result<UpgradeRequest> bogus = ParseUpgradeArgs(args);
    EXPECT_EQ(bogus.status().code(), StatusCode::kInvalidArgument) << bogus.status().ToString();
    EXPECT_NE(bogus.status().message().find("unknown placeholder {bogus}"), std::string::npos)
        << bogus.status().ToString();
  }
  EXPECT_TRUE(ParseRollbackArgs({}).ok());
  EXPECT_TRUE(ParseRollbackArgs({"--steps", "100"}).ok());
  EXPECT_FALSE(ParseRollbackArgs({"--", "eng"}).ok());
}

}  // namespace
}  // namespace baton
