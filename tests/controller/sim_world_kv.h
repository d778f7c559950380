// SimWorld's KV-warm failover (sim_world.h): what a promoted simulated engine does with the
// KV its predecessor left, in place or by a copy before the predecessor's barrier, and what it
// tells the controller of it. Part of sim_world.h, which includes it at its end; include that
// header, not this one. Header-only test support; single-threaded.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace baton::sim {

// Whether an engine is dead and past its barrier (a forgotten engine is long dead).
inline std::function<bool(EngineId)> SimWorld::Fenced() {
  return [this](EngineId writer) {
    const SimEngine* w = Find(writer);
    return w == nullptr || (!w->alive && w->mapped.empty());
  };
}
inline void SimWorld::Count(const KvAdoptionReport& r) {
  kv_stats.kv_adopted += r.adopted;
  kv_stats.kv_dropped += r.dropped_total();
  if (auto it = r.dropped.find("torn"); it != r.dropped.end()) kv_stats.kv_torn += it->second;
  if (auto it = r.dropped.find("changed"); it != r.dropped.end()) kv_stats.kv_changed += it->second;
}
inline bool SimWorld::Overlaps(const std::vector<proto::BlockRange>& a,
                               const std::vector<proto::BlockRange>& b) {
  for (const proto::BlockRange& x : a) {
    for (const proto::BlockRange& y : b) {
      if (x.first < y.first + y.count && y.first < x.first + x.count) return true;
    }
  }
  return false;
}

// Its first Promote: it reads the records of the blocks handed over (rule 6 checked on
// every block it adopts) and reports once it serves.
inline void SimWorld::AdoptKv(SimEngine& e, const std::vector<proto::BlockRange>& extents,
                              bool map_rest) {
  const KvAdoptionReport r = e.kv->Adopt(
      extents, Fenced(), [this](const std::string& s) { Flag(s); }, map_rest);
  proto::KvAdopted report{.epoch = e.epoch, .adopted = r.adopted, .tokens = r.tokens};
  for (const auto& [reason, count] : r.dropped) {
    report.dropped_reasons.push_back(reason);
    report.dropped_counts.push_back(count);
  }
  Count(r);
  e.kv_report = std::move(report);
}

// A promotion before the barrier: the quarantined blocks' sequences are copied into its own
// blocks while their dying writer goes on (rule 6 checked on every copy kept), or, now and
// then (a copy that would cost more than the wait), adopted in place once they come.
inline void SimWorld::InheritKv(SimEngine& e, const std::vector<proto::BlockRange>& own) {
  const KvCopyPlan plan = e.kv->Plan(e.quarantined);
  proto::KvInherited report{.epoch = e.epoch, .blocks = plan.blocks, .bytes = plan.bytes};
  if (plan.sequences.empty() && !inherit_waits) {
    e.quarantined.clear();
  } else if (!inherit_waits && rng_.Chance(70)) {
    report.mode = static_cast<uint8_t>(proto::KvInheritMode::kCopied);
    // Not the promoted engine's own: whoever still writes the quarantine (the copy's race).
    auto killed = [this](EngineId writer) {
      const SimEngine* w = Find(writer);
      return w == nullptr || !w->Working();
    };
    const KvAdoptionReport r = e.kv->CopyIn(
        plan, e.quarantined, own, [this] { GhostWrites(); }, killed,
        [this](const std::string& s) { Flag(s); });
    Count(r);
    kv_stats.kv_copied += r.adopted;
    ++kv_stats.inherit_copied;
    if (e.kv_report.has_value()) {
      e.kv_report->adopted += r.adopted;
      e.kv_report->tokens += r.tokens;
    }
    e.quarantined.clear();
  } else {
    report.mode = static_cast<uint8_t>(proto::KvInheritMode::kWaited);
    ++kv_stats.inherit_waited;
    e.awaiting_inherited = true;
    e.serve_at = now() + e.wait_limit;
  }
  e.inherit_report = report;
}
inline void SimWorld::SendInheritReport(SimEngine& e) {
  proto::KvInherited m = *e.inherit_report;
  e.inherit_report.reset();
  if (rng_.Chance(5)) {
    m.mode = 9;  // a mode the controller must refuse
    ++kv_stats.kv_malformed;
  }
  Send(e, m, rng_.Millis(0, 3));
}
// The adoption report, now and then malformed (a reason the controller must refuse).
inline void SimWorld::SendKvReport(SimEngine& e) {
  proto::KvAdopted m = std::move(*e.kv_report);
  e.kv_report.reset();
  if (rng_.Chance(10)) {
    m.dropped_reasons.push_back("Not A Reason!");
    m.dropped_counts.push_back(1);
    ++kv_stats.kv_malformed;
  }
  Send(e, m, rng_.Millis(0, 3));
}

}  // namespace baton::sim
