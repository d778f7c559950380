#include "controller/core/promotion.h"

#include <algorithm>
#include <ctime>
#include <iterator>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "base/text/enum_names.h"

namespace baton {
namespace {

constexpr EnumNames<PromotionKind, 5> kPromotionKindNames{
    "promotion kind",
    {{{PromotionKind::kFailover, "failover"},
      {PromotionKind::kDrain, "drain"},
      {PromotionKind::kSwitchover, "switchover"},
      {PromotionKind::kUpgrade, "upgrade"},
      {PromotionKind::kPromotion, "promotion"}}}};
static_assert(kPromotionKindNames.entries.size() == std::size(kPromotionKinds));

std::optional<double> Between(const std::optional<TimePoint>& from,
                              const std::optional<TimePoint>& to) {
  if (!from.has_value() || !to.has_value()) return std::nullopt;
  return MillisBetween(*from, *to);
}

// "1 block", "4 blocks".
std::string Blocks(uint64_t n) { return std::to_string(n) + (n == 1 ? " block" : " blocks"); }

using Stamp = std::pair<const char*, const std::optional<TimePoint>*>;

std::vector<Stamp> Stamps(const PromotionRecord& r) {
  return {{"requested", &r.requested},
          {"injected", &r.injected},
          {"last_heartbeat", &r.last_heartbeat},
          {"detected", &r.detected},
          {"killed", &r.killed},
          {"epoch_durable", &r.epoch_durable},
          {"reaped", &r.reaped},
          {"gpu_released", &r.gpu_released},
          {"barrier_passed", &r.barrier_passed},
          {"promote_sent", &r.promote_sent},
          {"promote_acked", &r.promote_acked},
          {"kv_adopted", &r.kv_adopted},
          {"route_published", &r.route_published},
          {"standby_launched", &r.standby_launched},
          {"standby_ready", &r.standby_ready}};
}

std::optional<TimePoint> FirstStamp(const PromotionRecord& r) {
  std::optional<TimePoint> first;
  for (const auto& [name, stamp] : Stamps(r)) {
    if (stamp->has_value() && (!first.has_value() || **stamp < *first)) first = **stamp;
  }
  return first;
}

std::string Fixed(double ms) {
  std::ostringstream out;
  out.setf(std::ios::fixed);
  out.precision(2);
  out << ms;
  return out.str();
}

// "engine 7", or "no engine" for a promotion that followed none (the first of a pair).
std::string EngineText(uint64_t id) {
  return id == 0 ? std::string("no engine") : "engine " + std::to_string(id);
}

// " (engine 1 fenced at epoch 3)" when the old primary's fence epoch is not the new primary's
// (a canary that takes over serves at its own, earlier epoch); else "".
std::string FenceText(const PromotionRecord& r) {
  if (r.fence_epoch == 0 || r.fence_epoch == r.epoch) return "";
  return " (" + EngineText(r.old_engine) + " fenced at epoch " + std::to_string(r.fence_epoch) +
         ")";
}

}  // namespace

PhaseTimes PhasesOf(const PromotionRecord& r) {
  PhaseTimes p;
  const std::optional<TimePoint>& evidence = r.injected.has_value()    ? r.injected
                                             : r.requested.has_value() ? r.requested
                                                                       : r.last_heartbeat;
  p.detect_ms = Between(evidence.has_value() ? evidence : r.detected, r.detected);
  p.fence_ms = Between(r.detected, r.reaped);
  const bool reaped_first =
      r.reaped.has_value() && (!r.promote_sent.has_value() || *r.reaped <= *r.promote_sent);
  p.promote_ms = Between(reaped_first ? r.reaped : r.promote_sent, r.promote_acked);
  p.ready_ms = Between(r.detected.has_value() ? r.detected : r.promote_sent, r.route_published);
  p.total_ms = Between(FirstStamp(r), r.route_published);
  p.teardown_ms = Between(r.detected, r.barrier_passed);
  return p;
}

const char* ToString(PromotionKind kind) { return kPromotionKindNames.Name(kind); }

Result<PromotionKind> ParsePromotionKind(std::string_view text) {
  return kPromotionKindNames.Parse(text);
}

TimelineLog::TimelineLog(const Clock& clock, size_t limit) : clock_(&clock), limit_(limit) {}

PromotionRecord& TimelineLog::Open(PromotionKind kind, std::string cause) {
  if (open_) Close("superseded");
  PromotionRecord record;
  record.seq = next_seq_++;
  record.kind = kind;
  record.cause = std::move(cause);
  records_.push_back(std::move(record));
  if (records_.size() > limit_) records_.pop_front();
  open_ = true;
  return records_.back();
}

PromotionRecord* TimelineLog::current() { return open_ ? &records_.back() : nullptr; }

const PromotionRecord* TimelineLog::last() const {
  return records_.empty() ? nullptr : &records_.back();
}

PromotionRecord* TimelineLog::Promoted(uint64_t engine, uint64_t epoch) {
  for (auto it = records_.rbegin(); it != records_.rend(); ++it) {
    if (it->new_engine == engine && it->epoch == epoch) return &*it;
  }
  return nullptr;
}

PromotionRecord* TimelineLog::Fenced(uint64_t old_engine, uint64_t fence_epoch) {
  for (auto it = records_.rbegin(); it != records_.rend(); ++it) {
    if (it->old_engine == old_engine && it->fence_epoch == fence_epoch) return &*it;
  }
  return nullptr;
}

PromotionRecord* TimelineLog::awaiting_standby() {
  if (records_.empty()) return nullptr;
  PromotionRecord& r = records_.back();
  return r.promote_acked.has_value() && !r.standby_ready.has_value() && r.replacement_awaited
             ? &r
             : nullptr;
}

void TimelineLog::Close(std::string outcome) {
  if (!open_) return;
  records_.back().outcome = std::move(outcome);
  records_.back().complete = true;
  open_ = false;
}

nlohmann::json TimelineJson(const PromotionRecord& r, TimePoint now) {
  const std::optional<TimePoint> first = FirstStamp(r);
  nlohmann::json stamps = nlohmann::json::object();
  for (const auto& [name, stamp] : Stamps(r)) {
    if (stamp->has_value() && first.has_value())
      stamps[std::string(name) + "_ms"] = MillisBetween(*first, **stamp);
  }
  const PhaseTimes p = PhasesOf(r);
  nlohmann::json phases = nlohmann::json::object();
  auto put = [&](const char* name, const std::optional<double>& v) {
    if (v.has_value()) phases[name] = *v;
  };
  put("detect_ms", p.detect_ms);
  put("fence_ms", p.fence_ms);
  put("promote_ms", p.promote_ms);
  put("ready_ms", p.ready_ms);
  put("total_ms", p.total_ms);
  put("teardown_ms", p.teardown_ms);
  nlohmann::json j{{"seq", r.seq},
                   {"kind", ToString(r.kind)},
                   {"cause", r.cause},
                   {"old_engine", r.old_engine},
                   {"old_pid", r.old_pid},
                   {"new_engine", r.new_engine},
                   {"epoch", r.epoch},
                   {"fence_epoch", r.fence_epoch},
                   {"outcome", r.outcome},
                   {"complete", r.complete},
                   {"started_at", first.has_value() ? WallTime(*first, now) : ""},
                   {"stamps", stamps},
                   {"phases", phases}};
  j["promotion"] = {{"before_barrier", PromotedBeforeBarrier(r)},
                    {"waited", r.waited},
                    {"barrier_timed_out", r.barrier_timed_out},
                    {"quarantined_blocks", r.quarantined_blocks},
                    {"reserve_blocks", r.reserve_blocks}};
  if (r.kv_inherited.has_value()) {
    j["kv_inherited"] = {{"mode", ToString(r.kv_inherited->mode)},
                         {"blocks", r.kv_inherited->blocks},
                         {"bytes", r.kv_inherited->bytes},
                         {"ms", r.kv_inherited->ms},
                         {"estimate_ms", r.kv_inherited->estimate_ms}};
  }
  if (r.kv.has_value()) {
    j["kv"] = {{"adopted", r.kv->adopted},
               {"tokens", r.kv->tokens},
               {"dropped", r.kv->dropped},
               {"read_ms", r.kv->read_ms}};
  }
  return j;
}

std::string KvAdoptionText(const PromotionRecord::KvAdoption& kv) {
  std::ostringstream out;
  uint32_t dropped = 0;
  for (const auto& [reason, n] : kv.dropped) dropped += n;
  out << "adopted " << kv.adopted << " sequences (" << kv.tokens << " tokens not prefilled again), "
      << "dropped " << dropped;
  const char* sep = " (";
  for (const auto& [reason, n] : kv.dropped) {
    out << sep << reason << " " << n;
    sep = ", ";
  }
  if (!kv.dropped.empty()) out << ")";
  out << ", records read in " << Fixed(kv.read_ms) << " ms";
  return out.str();
}

bool PromotedBeforeBarrier(const PromotionRecord& r) {
  return r.old_engine != 0 && r.promote_sent.has_value() && r.waited.empty() &&
         (!r.barrier_passed.has_value() || *r.promote_sent <= *r.barrier_passed);
}

std::string PromotionText(const PromotionRecord& r) {
  if (r.old_engine == 0) return "no old primary: nothing was fenced or quarantined";
  std::ostringstream out;
  if (PromotedBeforeBarrier(r) || (r.waited.empty() && !r.promote_sent.has_value())) {
    out << "before the barrier, on a reserve of " << Blocks(r.reserve_blocks) << "; "
        << Blocks(r.quarantined_blocks) << " quarantined until it passed";
  } else if (r.waited.empty()) {
    out << "after the barrier (the standby was not ready before it passed); "
        << Blocks(r.quarantined_blocks) << " quarantined";
  } else {
    out << "waited for the barrier (" << r.waited << "); " << Blocks(r.quarantined_blocks)
        << " quarantined";
  }
  return out.str();
}

const char* ToString(proto::KvInheritMode mode) {
  switch (mode) {
    case proto::KvInheritMode::kNone:
      return "none";
    case proto::KvInheritMode::kCopied:
      return "copied";
    case proto::KvInheritMode::kWaited:
      return "waited";
  }
  return "unknown";
}

std::string InheritanceText(const PromotionRecord::KvInheritance& kv) {
  std::ostringstream out;
  if (kv.mode == proto::KvInheritMode::kNone) return "no committed kv in the quarantined blocks";
  out << (kv.mode == proto::KvInheritMode::kCopied ? "copied " : "waited for the barrier for ")
      << Blocks(kv.blocks) << " (" << kv.bytes << " bytes) in " << Fixed(kv.ms)
      << " ms; a copy was estimated at " << Fixed(kv.estimate_ms) << " ms";
  return out.str();
}

std::string TimelineText(const PromotionRecord& r, TimePoint now) {
  std::ostringstream out;
  const std::optional<TimePoint> first = FirstStamp(r);
  out << ToString(r.kind) << " #" << r.seq << " (" << r.cause << "): " << EngineText(r.old_engine);
  if (r.old_pid != 0) out << " (pid " << r.old_pid << ")";
  out << " -> " << EngineText(r.new_engine) << " at epoch " << r.epoch << FenceText(r) << "; "
      << r.outcome;
  if (first.has_value()) out << "; started " << WallTime(*first, now);
  out << "\n";
  // In the order they happened (a barrier may pass before or after the promotion).
  std::vector<std::pair<double, std::string_view>> lines;
  for (const auto& [name, stamp] : Stamps(r)) {
    if (stamp->has_value() && first.has_value()) {
      lines.emplace_back(MillisBetween(*first, **stamp), name);
    }
  }
  std::stable_sort(lines.begin(), lines.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [ms, name] : lines) out << "  +" << Fixed(ms) << " ms  " << name << "\n";
  const PhaseTimes p = PhasesOf(r);
  out << "  phases:";
  auto put = [&](const char* name, const std::optional<double>& v) {
    if (v.has_value()) out << " " << name << " " << Fixed(*v) << " ms";
  };
  put("detect", p.detect_ms);
  put("fence", p.fence_ms);
  put("promote", p.promote_ms);
  put("ready", p.ready_ms);
  put("total", p.total_ms);
  put("teardown", p.teardown_ms);
  out << "\n";
  if (r.promote_sent.has_value()) out << "  promotion: " << PromotionText(r) << "\n";
  if (r.barrier_timed_out) {
    out << "  barrier: timed out (a process of the old primary was still alive or listed on "
           "the GPU; each was sent SIGKILL and its blocks moved on)\n";
  }
  if (r.kv_inherited.has_value())
    out << "  kv inherited: " << InheritanceText(*r.kv_inherited) << "\n";
  if (r.kv.has_value()) out << "  kv: " << KvAdoptionText(*r.kv) << "\n";
  return out.str();
}

std::string TimelineLog::Summary(const PromotionRecord& r) {
  const PhaseTimes p = PhasesOf(r);
  std::ostringstream out;
  out << ToString(r.kind) << " #" << r.seq << " (" << r.cause << "): " << EngineText(r.old_engine)
      << " -> " << EngineText(r.new_engine) << " at epoch " << r.epoch << FenceText(r);
  auto put = [&](const char* name, const std::optional<double>& v) {
    if (v.has_value()) out << ", " << name << " " << Fixed(*v) << " ms";
  };
  put("detect", p.detect_ms);
  put("fence", p.fence_ms);
  put("promote", p.promote_ms);
  put("ready", p.ready_ms);
  put("teardown", p.teardown_ms);
  return out.str();
}

std::string WallTime(TimePoint t, TimePoint now) {
  const auto wall = std::chrono::system_clock::now() -
                    std::chrono::duration_cast<std::chrono::system_clock::duration>(now - t);
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(wall.time_since_epoch()).count();
  const std::time_t secs = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  ::gmtime_r(&secs, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &tm);
  char out[48];
  std::snprintf(out, sizeof(out), "%s.%03dZ", buf, static_cast<int>(ms % 1000));
  return out;
}

}  // namespace baton
