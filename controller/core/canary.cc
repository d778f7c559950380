#include "controller/core/canary.h"

#include <algorithm>
#include <charconv>
#include <cstdio>

namespace baton {
namespace {

double Rate(uint64_t part, uint64_t whole) {
  return whole == 0 ? 0.0 : static_cast<double>(part) / static_cast<double>(whole);
}

double MeanMs(const proto::EngineOutcome& o) {
  return o.succeeded == 0 ? 0.0 : static_cast<double>(o.duration_ms) / o.succeeded;
}

std::string Fixed(double v, int digits) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

}  // namespace

const char* ToString(CanaryJudge::Verdict verdict) {
  switch (verdict) {
    case CanaryJudge::Verdict::kHold:
      return "hold";
    case CanaryJudge::Verdict::kAdvance:
      return "advance";
    case CanaryJudge::Verdict::kPromote:
      return "promote";
    case CanaryJudge::Verdict::kRollback:
      return "rollback";
  }
  return "unknown";
}

Status ValidateCanaryPolicy(const CanaryPolicy& p) {
  if (p.steps.empty()) return InvalidArgument("canary steps: none given");
  for (size_t i = 0; i < p.steps.size(); ++i) {
    if (p.steps[i] < 1 || p.steps[i] > 100) {
      return InvalidArgument("canary steps: " + std::to_string(p.steps[i]) +
                             " is not a percentage in [1, 100]");
    }
    if (i > 0 && p.steps[i] <= p.steps[i - 1]) {
      return InvalidArgument("canary steps: must rise strictly, got " +
                             std::to_string(p.steps[i - 1]) + " then " +
                             std::to_string(p.steps[i]));
    }
  }
  if (p.steps.back() != 100) return InvalidArgument("canary steps: the last step must be 100");
  if (p.step_duration < Duration::zero()) return InvalidArgument("canary step duration < 0");
  if (p.max_error_rate_excess < 0 || p.max_error_rate_excess > 1) {
    return InvalidArgument("canary max_error_rate_excess: must be in [0, 1]");
  }
  if (p.max_latency_ratio < 1) return InvalidArgument("canary max_latency_ratio: must be >= 1");
  if (p.max_disagreement_rate < 0 || p.max_disagreement_rate > 1) {
    return InvalidArgument("canary max_disagreement_rate: must be in [0, 1]");
  }
  return OkStatus();
}

Result<std::vector<uint32_t>> ParseCanarySteps(const std::string& text) {
  std::vector<uint32_t> steps;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, comma - start);
    uint32_t v = 0;
    auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || ec != std::errc() || ptr != item.data() + item.size()) {
      return InvalidArgument("canary steps: '" + item + "' is not a number (want e.g. 10,50,100)");
    }
    steps.push_back(v);
    start = comma + 1;
  }
  CanaryPolicy check;
  check.steps = steps;
  BATON_RETURN_IF_ERROR(ValidateCanaryPolicy(check));
  return steps;
}

CanaryJudge::CanaryJudge(const Clock& clock, CanaryPolicy policy, uint64_t primary, uint64_t canary,
                         const OutcomeMap& at_start)
    : clock_(&clock),
      policy_(std::move(policy)),
      primary_(primary),
      canary_(canary),
      at_start_(at_start),
      at_step_(at_start),
      step_started_(clock.Now()) {}

proto::EngineOutcome CanaryJudge::Delta(const OutcomeMap& now, const OutcomeMap& then,
                                        uint64_t engine) {
  proto::EngineOutcome d{.engine_id = engine};
  auto it = now.find(engine);
  if (it == now.end()) return d;
  proto::EngineOutcome base{.engine_id = engine};
  if (auto b = then.find(engine); b != then.end()) base = b->second;
  // A router that restarted reports from zero: never count below nothing.
  auto sub = [](uint64_t a, uint64_t b) { return a >= b ? a - b : 0; };
  d.requests = sub(it->second.requests, base.requests);
  d.errors = sub(it->second.errors, base.errors);
  d.duration_ms = sub(it->second.duration_ms, base.duration_ms);
  d.succeeded = sub(it->second.succeeded, base.succeeded);
  d.compared = sub(it->second.compared, base.compared);
  d.disagreed = sub(it->second.disagreed, base.disagreed);
  return d;
}

proto::EngineOutcome CanaryJudge::Seen(uint64_t engine, const OutcomeMap& now) const {
  return Delta(now, at_start_, engine);
}

std::string CanaryJudge::CheckAgreement(const proto::EngineOutcome& c) const {
  const double limit = policy_.max_disagreement_rate;
  if (c.disagreed == 0 || (limit > 0 && c.compared < policy_.min_requests)) return "";
  const double rate = Rate(c.disagreed, c.compared);
  if (rate <= limit) return "";
  return "outputs differ from the primary's on " + std::to_string(c.disagreed) + " of " +
         std::to_string(c.compared) + " compared requests; the limit is " + Fixed(limit, 3);
}

std::optional<CanaryJudge::Baseline> CanaryJudge::PrimaryBaseline(const OutcomeMap& now) const {
  const Baseline tries[] = {
      {Delta(now, *at_warm_, primary_), "over the same time"},
      {Delta(now, at_start_, primary_), "since the canary started"},
      {Delta(at_start_, OutcomeMap{}, primary_), "before the canary started"}};
  for (const Baseline& b : tries) {
    if (b.outcome.succeeded >= policy_.min_requests) return b;
  }
  return std::nullopt;
}

std::string CanaryJudge::CheckLatency(const OutcomeMap& now) {
  if (!at_warm_.has_value()) {
    if (Seen(canary_, now).succeeded < policy_.latency_warmup_requests) return "";
    at_warm_ = policy_.latency_warmup_requests == 0 ? at_start_ : now;
  }
  const proto::EngineOutcome c = Delta(now, *at_warm_, canary_);
  if (c.succeeded < policy_.min_requests) return "";
  const std::optional<Baseline> p = PrimaryBaseline(now);
  primary_baseline_missing_ = !p.has_value();
  if (!p.has_value()) return "";
  latency_judged_ = true;
  const double c_ms = std::max(1.0, MeanMs(c));
  const double p_ms = std::max(1.0, MeanMs(p->outcome));
  if (c_ms <= p_ms * policy_.max_latency_ratio) return "";
  return "mean request duration " + Fixed(MeanMs(c), 1) + " ms on the canary against " +
         Fixed(MeanMs(p->outcome), 1) + " ms on the primary (the canary's after its first " +
         std::to_string(policy_.latency_warmup_requests) + " requests, the primary's " + p->when +
         "); the limit is " + Fixed(policy_.max_latency_ratio, 2) + "x";
}

std::string CanaryJudge::CheckHealth(const OutcomeMap& now) {
  const proto::EngineOutcome c = Seen(canary_, now);
  const proto::EngineOutcome p = Seen(primary_, now);
  if (std::string bad = CheckAgreement(c); !bad.empty()) return bad;
  if (c.requests < policy_.min_requests) return "";
  const double c_err = Rate(c.errors, c.requests);
  const double p_err = Rate(p.errors, p.requests);
  if (c_err > p_err + policy_.max_error_rate_excess) {
    return "error rate " + Fixed(c_err, 3) + " on the canary (" + std::to_string(c.errors) +
           " of " + std::to_string(c.requests) + ") against " + Fixed(p_err, 3) +
           " on the primary; the limit is +" + Fixed(policy_.max_error_rate_excess, 3);
  }
  return CheckLatency(now);
}

CanaryJudge::Judgement CanaryJudge::Judge(const OutcomeMap& now) {
  if (std::string bad = CheckHealth(now); !bad.empty()) return {Verdict::kRollback, bad};
  const proto::EngineOutcome in_step = Delta(now, at_step_, canary_);
  const Duration held = clock_->Now() - step_started_;
  if (in_step.requests < policy_.min_requests) {
    return {Verdict::kHold, "step " + std::to_string(weight()) +
                                " %: " + std::to_string(in_step.requests) + " of " +
                                std::to_string(policy_.min_requests) + " requests seen"};
  }
  if (held < policy_.step_duration) {
    return {Verdict::kHold,
            "step " + std::to_string(weight()) + " %: held " +
                std::to_string(static_cast<int64_t>(MillisBetween(step_started_, clock_->Now()))) +
                " ms"};
  }
  if (last_step() && !latency_judged_) {
    const Duration wait =
        std::max<Duration>(policy_.step_duration * kUnjudgedLatencySteps, std::chrono::seconds(1));
    if (held < wait || !primary_baseline_missing_) {
      return {Verdict::kHold, "step 100 %: no latency evidence yet (the canary needs " +
                                  std::to_string(policy_.min_requests) +
                                  " requests after its warm-up, and the primary as many, since "
                                  "the warm-up, the canary's start or before it)"};
    }
    return {Verdict::kPromote,
            "promoted with its latency not judged: the primary served fewer than " +
                std::to_string(policy_.min_requests) + " requests to compare with, before or " +
                "during the canary"};
  }
  return {last_step() ? Verdict::kPromote : Verdict::kAdvance, ""};
}

void CanaryJudge::Advance(const OutcomeMap& now) {
  if (!last_step()) ++step_;
  at_step_ = now;
  step_started_ = clock_->Now();
}

}  // namespace baton
