// CanaryJudge: decides, from what the routers saw, whether a canary engine (a new engine
// version serving a share of the traffic next to the primary) moves to its next traffic
// step, is promoted, or is rolled back.
//
// The canary walks `steps` (percent of new requests, ascending, the last one 100). It leaves
// a step once it has held it for `step_duration` and served `min_requests` attempts in it;
// after the last step it is promoted. At any time it is rolled back when, over the whole
// canary (both sides counted from the canary's start, at least `min_requests` attempts on
// the canary):
//   * its error rate exceeds the primary's by more than `max_error_rate_excess`, or
//   * its mean request duration exceeds the primary's by more than `max_latency_ratio`
//     times (both sides need `min_requests` successful attempts; means under 1 ms count as
//     1 ms, so sub-millisecond noise never decides). Latency is counted from the first
//     judgement that sees the canary past `latency_warmup_requests` successful attempts (at 0,
//     from the canary's start): a new engine's first requests pay for kernel compilation,
//     graph capture and cold caches, which says nothing of the version's speed. The primary's
//     side counts from the same point; where it served fewer than `min_requests` since (a
//     late step sends it little, the 100 % step nothing), from the canary's start, or else
//     its requests before the canary. The last step holds until latency has been judged
//     once. Where the canary has its requests to judge by but the primary served fewer than
//     min_requests in its life, nothing can judge it: after kUnjudgedLatencySteps step
//     durations (1 s at least) it is promoted, the reason saying so. Or
//   * its outputs differ from the primary's on more than `max_disagreement_rate` of the
//     reproducible requests the routers compared (seeded or greedy, sent again to the
//     primary in the background). At 0 (the default) one disagreement is enough, whatever the
//     number of attempts; above 0 the rate is judged from `min_requests` comparisons on.
// A canary without enough traffic holds its step: it is never promoted on no evidence.
//
// Inputs are the cumulative per-engine counters of proto::EngineOutcome (summed over every
// router by RoutePublisher::Outcomes()); the judge keeps the values at the canary's start and
// at the step's start. Time comes from the injected Clock. Plain value; io_context thread.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/status.h"
#include "proto/messages.h"

namespace baton {

struct CanaryPolicy {
  std::vector<uint32_t> steps = {10, 50, 100};
  Duration step_duration = std::chrono::seconds(30);
  uint64_t min_requests = 20;
  double max_error_rate_excess = 0.05;
  double max_latency_ratio = 2.0;
  uint64_t latency_warmup_requests = 10;
  double max_disagreement_rate = 0.0;
};

// Checks the steps (1..100, strictly ascending, ending at 100) and the limits.
Status ValidateCanaryPolicy(const CanaryPolicy& policy);
// "10,50,100" -> {10, 50, 100}; refuses anything else with the reason.
Result<std::vector<uint32_t>> ParseCanarySteps(const std::string& text);

using OutcomeMap = std::map<uint64_t, proto::EngineOutcome>;

class CanaryJudge {
 public:
  static constexpr int kUnjudgedLatencySteps = 4;
  enum class Verdict { kHold, kAdvance, kPromote, kRollback };
  struct Judgement {
    Verdict verdict = Verdict::kHold;
    std::string reason;  // why (for kRollback), or what it waits for (kHold)
  };

  // Starts at step 0 now; `at_start` are the counters when the canary started serving.
  CanaryJudge(const Clock& clock, CanaryPolicy policy, uint64_t primary, uint64_t canary,
              const OutcomeMap& at_start);

  // Judges the counters `now`. kAdvance and kPromote are only advice: the caller moves on
  // with Advance() (kPromote: the last step is done). The first call that sees the canary
  // past its warm-up keeps `now` as the start of the latency window.
  Judgement Judge(const OutcomeMap& now);
  // Moves to the next step, from now.
  void Advance(const OutcomeMap& now);

  size_t step() const { return step_; }
  uint32_t weight() const { return policy_.steps[step_]; }
  bool last_step() const { return step_ + 1 == policy_.steps.size(); }
  const CanaryPolicy& policy() const { return policy_; }
  TimePoint step_started() const { return step_started_; }
  uint64_t primary() const { return primary_; }
  uint64_t canary() const { return canary_; }
  // Since the canary started.
  proto::EngineOutcome Seen(uint64_t engine, const OutcomeMap& now) const;

 private:
  static proto::EngineOutcome Delta(const OutcomeMap& now, const OutcomeMap& then, uint64_t engine);
  std::string CheckHealth(const OutcomeMap& now);
  struct Baseline {
    proto::EngineOutcome outcome;
    std::string when;  // which of the primary's requests, for the reason
  };
  // The primary's requests the canary's latency is compared with (see above); none when it
  // has served fewer than min_requests in each.
  std::optional<Baseline> PrimaryBaseline(const OutcomeMap& now) const;
  std::string CheckLatency(const OutcomeMap& now);
  std::string CheckAgreement(const proto::EngineOutcome& canary) const;

  const Clock* clock_;
  CanaryPolicy policy_;
  uint64_t primary_;
  uint64_t canary_;
  OutcomeMap at_start_;
  OutcomeMap at_step_;
  std::optional<OutcomeMap> at_warm_;  // where latency counts from, once the canary warmed up
  bool latency_judged_ = false;        // a latency comparison has been made (and passed)
  // The canary had its requests to judge by, the primary had none (the last CheckLatency).
  bool primary_baseline_missing_ = false;
  size_t step_ = 0;
  TimePoint step_started_;
};

const char* ToString(CanaryJudge::Verdict verdict);

}  // namespace baton
