// SimWorld: the ground truth of the controller simulation (simulation_test.cc).
//
// It models what the controller cannot see directly: which engine processes are alive,
// hung, killed, exited, reaped; when a dead process's device work has drained (the barrier);
// which pool blocks each process really has mapped writable; which epochs were durable when
// they were sent. The simulated controller acts on it only through the calls an operating
// system or a socket would offer (launch, kill, reap, barrier query, deliver a message), and
// every delivery is checked here against fencing rules 1-5 independently of the ledger.
//
// Header-only test support; single-threaded; deterministic for a given seed.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/status.h"
#include "controller/core/epoch_journal.h"
#include "controller/core/pool_ledger.h"

namespace baton::sim {

using std::chrono::milliseconds;

// splitmix64: small, fast, and the same on every platform.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [lo, hi].
  uint64_t Range(uint64_t lo, uint64_t hi) { return lo + Next() % (hi - lo + 1); }
  bool Chance(unsigned percent) { return Next() % 100 < percent; }

 private:
  uint64_t state_;
};

// An epoch store whose durable part survives a simulated controller restart. With
// skip_fsync set (a deliberate fault) Advance returns epochs that never become durable.
class SimEpochStore final : public EpochStore {
 public:
  uint64_t current() const override { return value_; }
  Result<uint64_t> Advance() override {
    ++value_;
    if (!skip_fsync) durable_ = value_;
    return value_;
  }
  void Restart() { value_ = durable_; }
  uint64_t durable() const { return durable_; }
  bool skip_fsync = false;

 private:
  uint64_t value_ = 0;
  uint64_t durable_ = 0;
};

enum class MsgKind { kHeartbeat, kGrant, kReturn, kError };

struct SimMessage {
  MsgKind kind = MsgKind::kHeartbeat;
  uint64_t epoch = 0;
  uint32_t blocks = 0;  // kGrant
  Extent extent;        // kReturn
};

inline SimMessage Msg(MsgKind kind, uint64_t epoch, uint32_t blocks = 0, Extent extent = {}) {
  SimMessage m;
  m.kind = kind;
  m.epoch = epoch;
  m.blocks = blocks;
  m.extent = extent;
  return m;
}

struct SimEngine {
  EngineId id = kNoEngine;
  bool alive = true;  // process running (a killed process runs until exit_at)
  bool hung = false;
  bool killed = false;
  bool reaped = false;
  bool registered = false;
  bool promoted = false;
  uint64_t epoch = 0;
  TimePoint register_at, exit_at, release_at;
  std::set<uint32_t> mapped;  // writable, until reaped and past the barrier
  std::optional<SimMessage> last_sent;
};

// What an engine tells a restarted controller when it reconnects.
struct Claim {
  bool promoted = false;
  uint64_t epoch = 0;
  std::vector<Extent> extents;
};

class SimWorld {
 public:
  SimWorld(FakeClock& clock, SimEpochStore& store, Rng& rng, uint32_t blocks)
      : clock_(clock), store_(store), rng_(rng), blocks_(blocks) {}

  // --- operating system ---------------------------------------------------------------
  EngineId Launch() {
    SimEngine& e = engines_[next_id_];
    e.id = next_id_++;
    e.register_at = clock_.Now() + milliseconds(rng_.Range(10, 150));
    roster_.insert(e.id);
    Trace("controller launches engine " + std::to_string(e.id));
    return e.id;
  }
  // SIGKILL through the pidfd. `for_hang`: the detector declared the engine hung.
  void Kill(EngineId id, bool for_hang) {
    SimEngine& e = engines_.at(id);
    hang_kills += for_hang;
    if (for_hang && !e.hung && e.alive && !e.killed) {
      Flag("model: a live, answering engine " + std::to_string(id) + " was killed as hung");
    }
    if (!e.alive || e.killed) return;
    Trace("controller kills engine " + std::to_string(id) + (for_hang ? " (hung)" : ""));
    e.killed = true;
    e.exit_at = clock_.Now() + milliseconds(rng_.Range(0, 20));
    Settle();
  }
  bool Exited(EngineId id) const { return !engines_.at(id).alive; }
  bool Reap(EngineId id) {
    SimEngine& e = engines_.at(id);
    if (e.alive) return false;
    e.reaped = true;
    Settle();
    return true;
  }
  bool BarrierPassed(EngineId id) const {
    const SimEngine& e = engines_.at(id);
    return e.reaped && clock_.Now() >= e.release_at;
  }
  // Processes launched by any controller incarnation and not yet forgotten (the daemon
  // keeps this list in its runtime directory).
  std::vector<EngineId> Roster() const { return {roster_.begin(), roster_.end()}; }
  void ForgetRoster(EngineId id) { roster_.erase(id); }

  // --- controller -> engine messages -------------------------------------------------------
  void DeliverPromote(EngineId id, uint64_t epoch) {
    CheckDurable(epoch, "promotion of engine " + std::to_string(id));
    if (epoch <= max_promoted_epoch_) {
      Flag("invariant 3 (epochs monotonic): engine " + std::to_string(id) + " promoted at epoch " +
           std::to_string(epoch) + " after epoch " + std::to_string(max_promoted_epoch_) +
           " was already used");
    }
    max_promoted_epoch_ = std::max(max_promoted_epoch_, epoch);
    ++promotions;
    SimEngine& e = engines_.at(id);
    e.promoted = true;
    e.epoch = epoch;
    Trace("controller promotes engine " + std::to_string(id) + " at epoch " +
          std::to_string(epoch));
  }
  void DeliverGrant(EngineId id, const std::vector<Extent>& extents, uint64_t epoch) {
    CheckDurable(epoch, "grant to engine " + std::to_string(id));
    SimEngine& e = engines_.at(id);
    if (!e.alive) return;
    std::string what;
    for (const Extent& x : extents) what += " " + ToString(x);
    Trace("engine " + std::to_string(id) + " maps" + what + " at epoch " + std::to_string(epoch));
    for (const Extent& x : extents) {
      for (uint32_t b = x.first; b < x.end(); ++b) e.mapped.insert(b);
    }
  }
  // Health request; true if answered.
  bool Probe(EngineId id) const {
    const SimEngine& e = engines_.at(id);
    return e.alive && !e.hung;
  }

  // --- engine -> controller messages ---------------------------------------------------
  // Ground truth: a message is stale if its sender is dead or killed, or it does not carry
  // the sender's own epoch.
  bool IsStale(EngineId id, const SimMessage& m) const {
    const SimEngine& e = engines_.at(id);
    return !e.alive || e.killed || m.epoch != e.epoch;
  }
  // Records the controller's verdict on a message and checks it; `stale` is IsStale()
  // taken before the controller saw the message.
  void Judge(EngineId id, const SimMessage& m, bool stale, const Status& verdict) {
    SimEngine& e = engines_.at(id);
    if (verdict.ok() && stale) {
      Flag("invariant 4 (stale messages refused): accepted a stale message from engine " +
           std::to_string(id) + " at epoch " + std::to_string(m.epoch));
    }
    if (verdict.ok() && m.kind == MsgKind::kReturn) {
      for (uint32_t b = m.extent.first; b < m.extent.end(); ++b) {
        if (!e.mapped.count(b)) {
          Flag("refusal: engine " + std::to_string(id) + " returned block " + std::to_string(b) +
               " it does not hold and it was accepted");
        }
      }
    }
    if (!stale) e.last_sent = m;
  }

  // --- faults and time ---------------------------------------------------------------------
  void Crash(EngineId id) {
    SimEngine& e = engines_.at(id);
    if (!e.alive) return;
    e.alive = false;
    e.release_at = clock_.Now() + milliseconds(rng_.Range(0, 60));
  }
  void Advance(Duration d) {
    clock_.Advance(d);
    Settle();
  }
  // Applies exits of killed processes and clears mappings of reaped, drained ones.
  void Settle() {
    const TimePoint now = clock_.Now();
    for (auto& [id, e] : engines_) {
      if (e.alive && e.killed && now >= e.exit_at) {
        e.alive = false;
        e.release_at = now + milliseconds(rng_.Range(0, 60));
      }
      if (!e.alive && e.reaped && now >= e.release_at) e.mapped.clear();
    }
    if (store_.durable() < last_durable_) Flag("invariant 3 (epochs monotonic): journal went back");
    last_durable_ = store_.durable();
  }

  // --- checks ---------------------------------------------------------------------------
  Status Check() const {
    if (!violation_.empty()) return Internal(violation_);
    std::vector<int> live(blocks_, 0), mappers(blocks_, 0);
    for (const auto& [id, e] : engines_) {
      if (!e.promoted && !e.mapped.empty()) {
        return Internal("invariant 5 (standby maps nothing writable): engine " +
                        std::to_string(id) + " maps block " + std::to_string(*e.mapped.begin()) +
                        " without being promoted");
      }
      for (uint32_t b : e.mapped) {
        ++mappers[b];
        live[b] += e.alive;
      }
    }
    for (uint32_t b = 0; b < blocks_; ++b) {
      if (live[b] > 1) {
        return Internal("invariant 1 (one writer per block): block " + std::to_string(b) +
                        " is mapped writable by " + std::to_string(live[b]) + " live engines");
      }
      if (mappers[b] > 1) {
        return Internal("invariant 2 (no use before reap and barrier): block " + std::to_string(b) +
                        " was handed on before its old holder was reaped "
                        "and past the barrier");
      }
    }
    return OkStatus();
  }
  // Appends controller actions to `log` (verbose runs only).
  void SetTrace(std::vector<std::string>* log) { trace_ = log; }
  void Trace(const std::string& what) {
    if (trace_ == nullptr) return;
    trace_->push_back("t=" + std::to_string(clock_.Now().time_since_epoch().count() / 1000000) +
                      "ms   " + what);
  }

  void Flag(const std::string& what) {
    if (violation_.empty()) violation_ = what;
  }

  std::map<EngineId, SimEngine>& engines() { return engines_; }
  SimEngine* Find(EngineId id) {
    auto it = engines_.find(id);
    return it == engines_.end() ? nullptr : &it->second;
  }
  TimePoint now() const { return clock_.Now(); }
  uint64_t promotions = 0;
  uint64_t hang_kills = 0;
  FakeClock& clock() { return clock_; }
  Rng& rng() { return rng_; }

  // Forgets long-gone engines beyond the last few (their stale messages stay replayable
  // while kept).
  void Prune() {
    size_t gone = 0;
    for (const auto& [id, e] : engines_) gone += !e.alive && e.mapped.empty();
    for (auto it = engines_.begin(); gone > 8 && it != engines_.end();) {
      const bool done = !it->second.alive && it->second.mapped.empty() && !roster_.count(it->first);
      if (done) {
        it = engines_.erase(it);
        --gone;
      } else {
        ++it;
      }
    }
  }

 private:
  void CheckDurable(uint64_t epoch, const std::string& what) {
    if (epoch > store_.durable()) {
      Flag("invariant 3 (epochs monotonic): " + what + " carries epoch " + std::to_string(epoch) +
           " before it was durable (durable " + std::to_string(store_.durable()) + ")");
    }
  }

  FakeClock& clock_;
  SimEpochStore& store_;
  Rng& rng_;
  uint32_t blocks_;
  EngineId next_id_ = 1;
  std::map<EngineId, SimEngine> engines_;
  std::set<EngineId> roster_;
  uint64_t max_promoted_epoch_ = 0;
  uint64_t last_durable_ = 0;
  std::string violation_;
  std::vector<std::string>* trace_ = nullptr;
};

}  // namespace baton::sim
