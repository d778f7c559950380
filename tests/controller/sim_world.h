// SimWorld: the ground truth of the controller simulation (simulation_test.cc).
//
// It models what the Coordinator cannot see directly: which engine processes are alive,
// hung, killed, exited; when a dead process's device work has drained (the barrier); which
// pool blocks each process really has mapped writable; which epochs were durable when they
// were sent. It also plays the engines: what each does with a controller message (map a
// Promote's or a Grant's extents, answer a health request, drain, stop) and what it tells
// a restarted controller (Register, or a Reattach with its own role, epoch and extents).
// Engines' replies, their connections closing and their exits are queued here with a small
// random delay; the driver (sim_driver.h) pops them and delivers them to the Coordinator as
// events, so nothing here calls into the Coordinator. Everything the controller sends is
// checked here against fencing rules 1-5 independently of the ledger. What each engine does
// with a controller message is in sim_world_engine.h, its KV-warm failover in
// sim_world_kv.h, the routers and the GPU around the engines in sim_services.h.
//
// Ownership: the driver owns the world, its clock, store and Rng. Header-only test support;
// single-threaded; deterministic for a given seed.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/status.h"
#include "controller/core/coordinator.h"
#include "controller/core/pool_ledger.h"
#include "tests/controller/sim_engine.h"
#include "tests/controller/sim_kv.h"
#include "tests/controller/sim_options.h"
#include "tests/controller/sim_services.h"

namespace baton::sim {

class SimWorld {
 public:
  SimWorld(FakeClock& clock, SimEpochStore& store, Rng& rng, uint32_t blocks,
           uint32_t blocks_per_chunk)
      : clock_(clock),
        store_(store),
        rng_(rng),
        blocks_(blocks),
        blocks_per_chunk_(std::max<uint32_t>(1, blocks_per_chunk)),
        kv_pool_(blocks) {}

  // Deaths reach the controller first through the engines' liveness pages (most of them):
  // the randomized simulation's world; the scenarios' see EOFs and exits only.
  void set_liveness_pages(bool on) { liveness_pages_ = on; }

  // --- operating system ---------------------------------------------------------------
  // Starts the engine process the controller asked for, with the id and token it chose.
  bool Launch(EngineId id, const std::string& token, int port,
              const std::vector<std::string>& command) {
    if (engines_.count(id) != 0) {
      Flag("model: engine id " + std::to_string(id) + " launched twice");
      return false;
    }
    SimEngine& e = engines_[id];
    e.id = id;
    e.token = token;
    e.port = port;
    e.bad_version = std::find(command.begin(), command.end(), "--bad") != command.end();
    e.kv = std::make_shared<SimEngineKv>(kv_pool_, clock_, id, &e.epoch);
    e.connect_at = now() + rng_.Millis(10, 150);
    Queue(WorldEvent{WorldEvent::Kind::kConnect, id, {}, ""}, e.connect_at);
    if (tracing()) Trace("controller launches engine " + std::to_string(id));
    return true;
  }
  // SIGKILL through the pidfd; closes its connection. Returns whether it was running.
  bool Kill(EngineId id) {
    SimEngine* e = Find(id);
    if (e == nullptr || !e->alive) return false;
    e->connected = e->attached = false;
    if (e->killed) return true;
    if (tracing()) Trace("controller kills engine " + std::to_string(id));
    e->killed = true;
    e->exit_at = std::min(e->exiting ? e->exit_at : TimePoint::max(), now() + rng_.Millis(0, 20));
    return true;
  }
  // SIGTERM, or the engine obeying a Stop: it exits on its own shortly.
  void Stop(EngineId id) {
    SimEngine* e = Find(id);
    if (e == nullptr || !e->alive || e->exiting || e->killed) return;
    e->exiting = true;
    e->exit_at = now() + rng_.Millis(0, 10);
  }
  // SIGKILL and a synchronous reap (the daemon's end of a shutdown grace): dead now, its exit
  // told by the caller.
  void Reap(EngineId id) {
    SimEngine* e = Find(id);
    if (e == nullptr || !e->alive) return;
    e->killed = e->exit_reported = true;
    e->exit_at = now();
    Die(*e, "killed by signal 9");
  }
  // Its exit is reported to the controller after `delay` (its pidfd became readable).
  void ReportExit(EngineId id, const std::string& how, Duration delay) {
    SimEngine& e = engines_.at(id);
    e.exit_reported = true;
    Queue(WorldEvent{WorldEvent::Kind::kExited, id, {}, how}, now() + delay);
  }
  // What still holds the barrier of engine `id` ("" once its process is gone and its device
  // work drained).
  std::string BarrierHeldBy(EngineId id) const {
    auto it = engines_.find(id);
    if (it == engines_.end()) return "";
    if (it->second.alive) return "its process is still running";
    if (now() < it->second.release_at) return "its device work has not drained";
    return "";
  }

  // --- controller -> engine ------------------------------------------------------------
  // The engine's side of Effects::Send: checks, then does what the engine would.
  Status Receive(EngineId id, const ToEngine& message) {
    SimEngine* e = Find(id);
    if (e == nullptr || !e->alive || !e->connected) {
      return Unavailable("engine " + std::to_string(id) + " is not connected");
    }
    if (const auto* p = std::get_if<proto::Promote>(&message)) {
      CheckDurable(p->epoch, "promotion of engine " + std::to_string(id));
      if (p->epoch <= max_promoted_epoch_) {
        Flag("invariant 3 (epochs monotonic): engine " + std::to_string(id) +
             " promoted at epoch " + std::to_string(p->epoch) + " after epoch " +
             std::to_string(max_promoted_epoch_) + " was already used");
      }
      max_promoted_epoch_ = std::max(max_promoted_epoch_, p->epoch);
      e->promote_epoch = p->epoch;
      ++promotions;
    } else if (const auto* g = std::get_if<proto::Grant>(&message)) {
      ++e->grants;
      if (g->epoch != e->promote_epoch) {
        Flag("invariant 4 (stale messages refused): engine " + std::to_string(id) +
             " was granted blocks at epoch " + std::to_string(g->epoch) + " but holds epoch " +
             std::to_string(e->promote_epoch) + ": a message at another epoch was acted on");
      }
      CheckDurable(g->epoch, "grant to engine " + std::to_string(id));
    } else if (std::holds_alternative<proto::Stop>(message)) {
      e->stop_received = true;
    } else if (const auto* q = std::get_if<proto::Quarantined>(&message)) {
      CheckDurable(q->epoch, "the quarantine sent to engine " + std::to_string(id));
      for (const proto::BlockRange& r : q->extents) {
        for (uint32_t b = r.first; b < r.first + r.count; ++b) {
          if (e->mapped.count(b) != 0) {
            Flag("model: engine " + std::to_string(id) + " was told its own block " +
                 std::to_string(b) + " is quarantined");
          }
        }
      }
    }
    if (!e->Working()) return OkStatus();  // frozen or on its way out: it reads nothing
    std::visit([&](const auto& m) { Handle(*e, m); }, message);
    return OkStatus();
  }
  void Disconnect(EngineId id) {
    if (SimEngine* e = Find(id)) e->connected = e->attached = false;
  }
  // The working engine `e` unmaps up to `blocks` of its highest blocks and returns them in
  // one ReturnExtents: a Reclaim's answer, or blocks it gives up of its own accord.
  void GiveBack(SimEngine& e, uint32_t blocks);

  // --- engine -> controller ------------------------------------------------------------
  // A message the engine sends now, delivered after `delay`; one engine's messages arrive
  // in the order sent.
  // Returns when it arrives: `delay` from now, or after the engine's messages before it.
  TimePoint Send(SimEngine& e, const FromEngine& m, Duration delay) {
    Note(e, m);
    TimePoint at = std::max(now() + delay, last_message_at_[e.id]);
    last_message_at_[e.id] = at;
    Queue(WorldEvent{WorldEvent::Kind::kMessage, e.id, m, ""}, at);
    return at;
  }
  // Records `m` as sent by `e` (for stale replays later).
  void Note(SimEngine& e, const FromEngine& m) {
    e.last_sent = m;
    if (!e.promoted && CarriesEpoch(m)) e.standby_sent = m;
  }
  // What the engine says first on a new connection: Register, or what it holds.
  FromEngine Opening(const SimEngine& e) const {
    if (!e.registered) {
      return proto::Register{
          .engine_id = e.id, .engine_version = kEngineVersion, .http_address = Address(e)};
    }
    proto::ReattachRole role = proto::ReattachRole::kStandby;
    if (e.drained) {
      role = proto::ReattachRole::kDrained;
    } else if (e.draining) {
      role = proto::ReattachRole::kDraining;
    } else if (e.serving) {
      role = proto::ReattachRole::kServing;
    } else if (e.promoted) {
      role = proto::ReattachRole::kPromoted;
    }
    return proto::Reattach{.engine_id = e.id,
                           .engine_version = kEngineVersion,
                           .http_address = Address(e),
                           .role = static_cast<uint8_t>(role),
                           .epoch = e.epoch,
                           .extents = Runs(e.mapped),
                           .arena_dev = kArenaDev,
                           .arena_ino = kArenaIno,
                           .pool_dev = kPoolDev,
                           .pool_ino = kPoolIno};
  }

  // --- faults and time -----------------------------------------------------------------
  // The process dies on its own (a crash, an OOM kill): its socket closes, its pidfd fires.
  void Crash(EngineId id) {
    SimEngine* e = Find(id);
    if (e == nullptr || !e->alive) return;
    e->exit_at = now();
    Die(*e, "killed by signal 9");
  }
  void Hang(EngineId id) {
    if (SimEngine* e = Find(id)) e->hung = true;
  }
  // The GPU fails (an Xid, a device fallen off the bus): usable again `down` later. Engines
  // that were working see their next kernel fail: some report a sticky device error.
  void LoseDevice(Duration down) {
    device.lost = true;
    device.back_at = now() + down;
    ++device.losses;
    if (tracing()) Trace("the device is lost");
    for (auto& [id, e] : engines_) {
      if (!e.Working() || !e.attached || !rng_.Chance(50)) continue;
      Send(e, proto::ErrorReport{.epoch = e.epoch, .code = 13, .message = device.reason},
           rng_.Millis(0, 20));
    }
  }
  // The controller is gone: its connections and pidfds with it, and what was in flight.
  // Engines that were registered reconnect (after their weights are mapped) and reattach,
  // those launched but not registered yet register; frozen ones never come back.
  void ControllerRestarted() {
    queue_.clear();
    last_message_at_.clear();
    for (auto& [id, e] : engines_) {
      e.connected = e.attached = false;
      e.exit_reported = !e.alive;  // the new controller finds the dead gone, awaits the others
      if (!e.Working()) continue;
      if (rng_.Chance(4)) {
        e.hung = true;  // frozen across the restart: it never reattaches
        continue;
      }
      TimePoint at = now() + (rng_.Chance(5) ? rng_.Millis(250, 500) : rng_.Millis(5, 120));
      if (e.ready_at.has_value()) at = std::max(at, *e.ready_at);
      if (!e.registered) at = std::max(at, e.connect_at);
      e.connect_at = at;
      Queue(WorldEvent{WorldEvent::Kind::kConnect, id, {}, ""}, at);
    }
  }
  // Applies what time did: engines' own timers, exits of killed and stopping processes, and
  // mappings cleared once a dead process's device work drained.
  void Settle() {
    const TimePoint t = now();
    for (auto& [id, e] : engines_) {
      if (e.alive && (e.killed || e.exiting) && t >= e.exit_at) {
        Die(e, e.killed ? "killed by signal 9" : "exited with status 0");
      }
      if (!e.alive && !e.mapped.empty() && t >= e.release_at) e.mapped.clear();
      if (!e.Working()) continue;
      if (e.ready_at.has_value() && t >= *e.ready_at) {
        e.ready_at.reset();
        if (e.attached && !standbys_never_ready) {
          Send(e, proto::StandbyReady{.arena_mapped_bytes = 1 << 20, .reserved_bytes = 1 << 20},
               rng_.Millis(0, 3));
        }
      }
      if (e.serve_at.has_value() && t >= *e.serve_at) {
        e.serve_at.reset();
        e.serving = true;
        if (e.awaiting_inherited) ++kv_stats.inherit_timed_out;
        e.awaiting_inherited = false;  // the wait limit: what did not come is replayed
        e.quarantined.clear();
        if (e.attached && e.inherit_report.has_value()) SendInheritReport(e);
        if (e.attached && e.kv_report.has_value()) SendKvReport(e);
        if (e.attached) {
          Send(e,
               proto::PromoteAck{.epoch = e.epoch,
                                 .blocks_mapped = static_cast<uint32_t>(e.mapped.size())},
               rng_.Millis(0, 3));
        }
      }
      if (e.drained_at.has_value() && t >= *e.drained_at) SendDrained(e);
    }
    if (store_.durable() < last_durable_) Flag("invariant 3 (epochs monotonic): journal went back");
    last_durable_ = store_.durable();
  }
  // Every serving engine runs a step of generation on its KV, and every engine killed or dead
  // whose work has not drained yet writes on into the blocks it mapped.
  void Generate() {
    for (auto& [id, e] : engines_) {
      if (e.Working() && e.serving && !e.drained) {
        e.kv->Step(rng_, &kv_stats.kv_continued, [this](const std::string& s) { Flag(s); });
      }
    }
    GhostWrites();
  }
  void GhostWrites() {
    for (auto& [id, e] : engines_) {
      const bool tearing = e.alive ? e.killed : now() < e.release_at;
      if (!tearing || e.hung || e.clean_exit || !e.serving || e.mapped.empty()) continue;
      if (rng_.Chance(60)) e.kv->GhostStep(rng_);
    }
  }
  // The earliest queued event due now, if any.
  std::optional<WorldEvent> PopDue() {
    if (queue_.empty() || queue_.begin()->first > now()) return std::nullopt;
    WorldEvent ev = std::move(queue_.begin()->second);
    queue_.erase(queue_.begin());
    return ev;
  }
  // When the world next changes on its own (a queued event, an engine's timer, an exit).
  TimePoint NextEventAt() const {
    TimePoint at = queue_.empty() ? TimePoint::max() : queue_.begin()->first;
    for (const auto& [id, e] : engines_) {
      if (e.alive && (e.killed || e.exiting)) at = std::min(at, e.exit_at);
      if (!e.Working()) continue;
      for (const std::optional<TimePoint>& timer : {e.ready_at, e.serve_at, e.drained_at}) {
        if (timer.has_value()) at = std::min(at, *timer);
      }
    }
    return at;
  }

  // --- checks ---------------------------------------------------------------------------
  // Rules 1, 2 and 5 from what the processes map (by chunk on a device pool: an engine maps
  // the whole chunk of any block it holds), and the first violation flagged on the way.
  Status Check() const {
    if (!violation_.empty()) return Internal(violation_);
    const uint32_t chunks = (blocks_ + blocks_per_chunk_ - 1) / blocks_per_chunk_;
    std::vector<int> live(chunks, 0), mappers(chunks, 0);
    std::vector<uint32_t> seen;
    for (const auto& [id, e] : engines_) {
      if (e.mapped.empty()) continue;
      if (!e.promoted) {
        return Internal("invariant 5 (standby maps nothing writable): engine " +
                        std::to_string(id) + " maps block " + std::to_string(*e.mapped.begin()) +
                        " without being promoted");
      }
      seen.clear();
      for (uint32_t b : e.mapped) {
        const uint32_t c = b / blocks_per_chunk_;
        if (!seen.empty() && seen.back() == c) continue;
        seen.push_back(c);
        ++mappers[c];
        live[c] += e.alive;
      }
    }
    const std::string unit = blocks_per_chunk_ > 1 ? "chunk " : "block ";
    for (uint32_t c = 0; c < chunks; ++c) {
      if (live[c] > 1) {
        return Internal("invariant 1 (one writer per block): " + unit + std::to_string(c) +
                        " is mapped writable by " + std::to_string(live[c]) + " live engines");
      }
      if (mappers[c] > 1) {
        return Internal("invariant 2 (no use before reap and barrier): " + unit +
                        std::to_string(c) +
                        " was handed on before its old holder was reaped and past the barrier");
      }
    }
    return OkStatus();
  }
  void Flag(const std::string& what) {
    if (violation_.empty()) violation_ = what;
  }
  // Appends world events to `log` (verbose runs only).
  void SetTrace(std::vector<std::string>* log) { trace_ = log; }
  bool tracing() const { return trace_ != nullptr; }
  void Trace(const std::string& what) {
    if (trace_ == nullptr) return;
    trace_->push_back("t=" + std::to_string(Millis()) + "ms   " + what);
  }
  int64_t Millis() const {
    return std::chrono::duration_cast<milliseconds>(now().time_since_epoch()).count();
  }

  std::map<EngineId, SimEngine>& engines() { return engines_; }
  SimEngine* Find(EngineId id) {
    auto it = engines_.find(id);
    return it == engines_.end() ? nullptr : &it->second;
  }
  TimePoint now() const { return clock_.Now(); }
  Rng& rng() { return rng_; }
  uint64_t promotions = 0;
  Stats kv_stats;  // its kv_* counters
  SimRouter router;
  SimDevice device;
  // Set by a scenario: standbys register and never send StandbyReady, as an engine connected
  // with ready_when_waiting that never waits for its promotion. Never in the randomized
  // simulation.
  bool standbys_never_ready = false;
  // Set by a scenario: an engine promoted before the barrier waits for the quarantined blocks'
  // Grant (up to its wait limit) instead of copying their KV. Never in the randomized
  // simulation.
  bool inherit_waits = false;

  // Forgets engines the controller released, beyond the last few (their stale messages stay
  // replayable while kept).
  void Prune() {
    size_t gone = 0;
    for (const auto& [id, e] : engines_) gone += Forgettable(e);
    for (auto it = engines_.begin(); gone > 6 && it != engines_.end();) {
      if (Forgettable(it->second)) {
        last_message_at_.erase(it->first);
        it = engines_.erase(it);
        --gone;
      } else {
        ++it;
      }
    }
  }

 private:
  static bool Forgettable(const SimEngine& e) { return !e.alive && e.mapped.empty() && e.released; }
  static std::string Address(const SimEngine& e) { return "127.0.0.1:" + std::to_string(e.port); }
  void Queue(WorldEvent ev, TimePoint at) { queue_.emplace(at, std::move(ev)); }
  void Die(SimEngine& e, const std::string& how) {
    e.alive = false;
    e.clean_exit = e.exiting && !e.killed;
    e.release_at = now() + rng_.Millis(0, 60);
    if (tracing()) Trace("engine " + std::to_string(e.id) + " is dead: " + how);
    // Killed or crashed, it may have died inside a record's commit.
    if (e.kv && !(e.exiting && !e.killed)) e.kv->Die(rng_.Chance(30));
    // Most engines speak through the SDK, whose liveness page shows the death before the
    // connection ends (the messages it sent before still queued behind it).
    if (liveness_pages_ && e.connected && !e.clean_exit && rng_.Chance(70)) {
      Queue(WorldEvent{WorldEvent::Kind::kDying, e.id, {}, "its process is exiting"}, now());
    }
    if (e.connected) {
      e.connected = e.attached = false;
      Queue(WorldEvent{WorldEvent::Kind::kDisconnected, e.id, {}, "end of file"},
            now() + rng_.Millis(0, 3));
    }
    if (!e.exit_reported) ReportExit(e.id, how, rng_.Millis(0, 5));
  }
  // What a working engine does with each controller message (sim_world_engine.h).
  void SendDrained(SimEngine& e);
  void Map(SimEngine& e, const std::vector<proto::BlockRange>& extents, uint64_t epoch);
  void Handle(SimEngine& e, const SendRegisterAck&);
  void Handle(SimEngine& e, const proto::Promote& m);
  void Handle(SimEngine& e, const proto::Quarantined& m);
  void Handle(SimEngine& e, const proto::Grant& m);
  void Handle(SimEngine& e, const proto::Reclaim& m);
  void Handle(SimEngine& e, const proto::Drain&);
  void Handle(SimEngine& e, const proto::FinalDrain&);
  void Handle(SimEngine& e, const proto::Resume&);
  void Handle(SimEngine& e, const proto::Stop&);
  void Handle(SimEngine&, const proto::ErrorMsg&) {}
  void Handle(SimEngine& e, const proto::HealthRequest&);
  void Handle(SimEngine& e, const proto::InjectFault& m);
  void Handle(SimEngine& e, const proto::ReattachAck&);

  // KV-warm failover in the world (sim_world_kv.h).
  std::function<bool(EngineId)> Fenced();
  void Count(const KvAdoptionReport& r);
  static bool Overlaps(const std::vector<proto::BlockRange>& a,
                       const std::vector<proto::BlockRange>& b);
  void AdoptKv(SimEngine& e, const std::vector<proto::BlockRange>& extents, bool map_rest);
  void InheritKv(SimEngine& e, const std::vector<proto::BlockRange>& own);
  void SendInheritReport(SimEngine& e);
  void SendKvReport(SimEngine& e);

  void CheckDurable(uint64_t epoch, const std::string& what) {
    if (epoch > store_.durable()) {
      Flag("invariant 3 (epochs monotonic): " + what + " carries epoch " + std::to_string(epoch) +
           " before it was durable (durable " + std::to_string(store_.durable()) + ")");
    }
  }

  FakeClock& clock_;
  SimEpochStore& store_;
  Rng& rng_;
  bool liveness_pages_ = false;
  uint32_t blocks_;
  uint32_t blocks_per_chunk_;
  SimKvPool kv_pool_;
  std::map<EngineId, SimEngine> engines_;
  std::multimap<TimePoint, WorldEvent> queue_;
  std::map<EngineId, TimePoint> last_message_at_;
  uint64_t max_promoted_epoch_ = 0;
  uint64_t last_durable_ = 0;
  std::string violation_;
  std::vector<std::string>* trace_ = nullptr;
};

}  // namespace baton::sim

#include "tests/controller/sim_world_engine.h"  // IWYU pragma: export
#include "tests/controller/sim_world_kv.h"      // IWYU pragma: export
