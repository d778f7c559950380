// SimWorld's engines at work: what a working simulated engine does with each message the
// controller sends it (map a Promote's or a Grant's extents, give back what a Reclaim asks,
// drain, stop, answer a health request), as the engine SDK does. Part of sim_world.h, which
// includes it at its end; include that header, not this one. Header-only test support;
// single-threaded.
#pragma once

#include <set>
#include <vector>

namespace baton::sim {

inline void SimWorld::SendDrained(SimEngine& e) {
  e.drained_at.reset();
  e.drained = true;
  if (e.attached) Send(e, proto::Drained{.epoch = e.epoch, .unfinished = 0}, rng_.Millis(0, 3));
}
inline void SimWorld::Map(SimEngine& e, const std::vector<proto::BlockRange>& extents,
                          uint64_t epoch) {
  std::string what;
  for (const proto::BlockRange& r : extents) {
    if (r.count == 0 || r.first >= blocks_ || r.count > blocks_ - r.first) {
      Flag("model: engine " + std::to_string(e.id) + " was sent blocks outside the pool");
      return;
    }
    for (uint32_t b = r.first; b < r.first + r.count; ++b) e.mapped.insert(b);
    if (trace_ != nullptr) what += " " + ToString(Extent{r.first, r.count});
  }
  if (tracing()) {
    Trace("engine " + std::to_string(e.id) + " maps" + what + " at epoch " + std::to_string(epoch));
  }
}

// What a working engine does with each controller message.
inline void SimWorld::Handle(SimEngine& e, const SendRegisterAck&) {
  e.registered = e.attached = true;
  e.ready_at = now() + rng_.Millis(5, 60);
}
inline void SimWorld::Handle(SimEngine& e, const proto::Promote& m) {
  const bool first = !e.promoted;
  e.promoted = true;
  e.epoch = m.epoch;
  Map(e, m.extents, m.epoch);
  e.serve_at = now() + rng_.Millis(1, 30);
  if (!first) return e.kv->Map(m.extents);
  const bool before_barrier = !e.quarantined.empty();
  AdoptKv(e, m.extents, /*map_rest=*/!before_barrier);
  if (!before_barrier) {
    ++kv_stats.after_barrier;
    return;
  }
  ++kv_stats.before_barrier;
  InheritKv(e, m.extents);
  e.kv->Map(m.extents);
}
inline void SimWorld::Handle(SimEngine& e, const proto::Quarantined& m) {
  if (e.promoted) {
    // After its Promote, as the SDK: empty at its epoch, the blocks it waits for will not come.
    if (m.epoch != e.epoch || !m.extents.empty() || !e.awaiting_inherited) return;
    e.awaiting_inherited = false;
    e.quarantined.clear();
    e.serve_at = now() + rng_.Millis(1, 10);
    return;
  }
  e.quarantined = m.extents;
  e.wait_limit = std::chrono::milliseconds(m.wait_limit_ms);
}
inline void SimWorld::Handle(SimEngine& e, const proto::Grant& m) {
  Map(e, m.extents, m.epoch);
  if (!e.awaiting_inherited || !Overlaps(m.extents, e.quarantined)) return e.kv->Map(m.extents);
  // The quarantined blocks, past their barrier: adopted in place, then it serves.
  const KvAdoptionReport r =
      e.kv->Adopt(m.extents, Fenced(), [this](const std::string& s) { Flag(s); });
  Count(r);
  if (e.kv_report.has_value()) {
    e.kv_report->adopted += r.adopted;
    e.kv_report->tokens += r.tokens;
  }
  e.awaiting_inherited = false;
  e.quarantined.clear();
  e.serve_at = now() + rng_.Millis(1, 10);
}
inline void SimWorld::Handle(SimEngine& e, const proto::Reclaim& m) {
  if (e.holds_reclaims) return e.held_reclaims.push_back(m);
  GiveBack(e, m.blocks);
}
inline void SimWorld::GiveBack(SimEngine& e, uint32_t blocks) {
  std::set<uint32_t> give;
  for (auto it = e.mapped.rbegin(); it != e.mapped.rend() && give.size() < blocks; ++it) {
    give.insert(*it);
  }
  e.kv->Give(give);
  for (uint32_t b : give) e.mapped.erase(b);
  const TimePoint arrives =
      Send(e, proto::ReturnExtents{.epoch = e.epoch, .extents = Runs(give)}, rng_.Millis(1, 20));
  if (now() >= e.returning_until) e.returning.clear();
  e.returning.insert(give.begin(), give.end());
  e.returning_until = std::max(e.returning_until, arrives);
}
inline void SimWorld::Handle(SimEngine& e, const proto::Drain&) {
  e.draining = true;
  e.drained_at = now() + rng_.Millis(5, 80);
}
inline void SimWorld::Handle(SimEngine& e, const proto::FinalDrain&) {
  e.draining = true;
  e.drained_at = now() + rng_.Millis(5, 80);
}
inline void SimWorld::Handle(SimEngine& e, const proto::Resume&) {
  // Every Drain is answered by one Drained, sent before the engine serves again.
  if (e.drained_at.has_value()) SendDrained(e);
  e.draining = e.drained = false;
}
inline void SimWorld::Handle(SimEngine& e, const proto::Stop&) { Stop(e.id); }
inline void SimWorld::Handle(SimEngine& e, const proto::HealthRequest&) {
  if (e.attached)
    Send(e, proto::Heartbeat{.epoch = e.epoch, .seq = ++e.heartbeat_seq}, rng_.Millis(0, 20));
}
inline void SimWorld::Handle(SimEngine& e, const proto::InjectFault& m) {
  Send(e, proto::ErrorReport{.epoch = e.epoch, .code = 13, .message = m.message},
       rng_.Millis(0, 5));
}
// A promoted engine that had not acknowledged yet does once it serves (serve_at).
inline void SimWorld::Handle(SimEngine& e, const proto::ReattachAck&) { e.attached = true; }

}  // namespace baton::sim
