// The pieces of the controller simulation (simulation_test.cc) below the world: its PRNG,
// its epoch store, and one simulated engine process as the ground truth (sim_world.h) keeps
// it: its process, its connection to the current controller, and what it did and holds as
// the engine itself knows it, which is what it tells a restarted controller; and small
// helpers on the messages engines send.
//
// Ownership: the world owns its SimEngines; the driver (sim_driver.h) owns the Rng and the
// store. Header-only test support; single-threaded.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "base/clock.h"
#include "base/status.h"
#include "controller/core/coordinator.h"
#include "controller/core/epoch_store.h"
#include "controller/core/pool_ledger.h"

namespace baton::sim {

using std::chrono::milliseconds;

class SimEngineKv;  // sim_kv.h

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
  Duration Millis(uint64_t lo, uint64_t hi) { return milliseconds(Range(lo, hi)); }

 private:
  uint64_t state_;
};

// An epoch store whose durable part survives a simulated controller restart. With
// skip_fsync set (a deliberate fault) Advance returns epochs that never become durable. With
// a journal set, each epoch made durable is written there (the scenario tests' story).
class SimEpochStore final : public EpochStore {
 public:
  uint64_t current() const override { return value_; }
  Result<uint64_t> Advance() override {
    ++value_;
    if (!skip_fsync) durable_ = value_;
    if (journal != nullptr && !skip_fsync) {
      journal->push_back("EpochDurable(" + std::to_string(value_) + ")");
    }
    return value_;
  }
  void Restart() { value_ = durable_; }
  uint64_t durable() const { return durable_; }
  bool skip_fsync = false;
  std::vector<std::string>* journal = nullptr;  // "EpochDurable(N)" per epoch made durable

 private:
  uint64_t value_ = 0;
  uint64_t durable_ = 0;
};

// The st_dev / st_ino of the weight arena and pool memfds: what every engine maps and what
// a restarted controller adopted (StartState), so that reattaching engines match.
inline constexpr uint64_t kArenaDev = 0x2b, kArenaIno = 7001, kPoolDev = 0x2b, kPoolIno = 7002;
inline constexpr const char* kEngineVersion = "sim-1.0";

// One engine process, as it is (not as the controller believes it to be).
struct SimEngine {
  EngineId id = kNoEngine;
  std::string token;
  int port = 0;
  bool bad_version = false;  // launched with a broken candidate command (sim_services.h)
  // The process.
  bool alive = true;     // running (a killed or stopping process runs until exit_at)
  bool hung = false;     // frozen: reads, sends and maps nothing more
  bool killed = false;   // SIGKILL sent
  bool exiting = false;  // told to stop (Stop, SIGTERM)
  TimePoint exit_at{}, release_at{};
  bool exit_reported = false;  // its exit is queued for (or was delivered to) the controller
  bool released = false;       // the controller said it needs nothing more of it
  // Its connection to the current controller.
  bool connected = false;  // Hello accepted
  bool attached = false;   // RegisterAck or ReattachAck received from this controller
  TimePoint connect_at{};  // when it (re)connects
  // What it did, as it knows it (kept across controller restarts).
  bool registered = false;            // a RegisterAck received
  std::optional<TimePoint> ready_at;  // mapping the weights; StandbyReady then
  bool promoted = false;              // Promote received: maps its extents at `epoch`
  std::optional<TimePoint> serve_at;  // promoted, taking over; PromoteAck then
  bool serving = false;               // PromoteAck sent
  bool draining = false;              // Drain received, not resumed
  std::optional<TimePoint> drained_at;
  bool drained = false;  // Drained sent, not resumed
  bool stop_received = false;
  uint64_t epoch = 0;
  uint64_t promote_epoch = 0;  // the epoch of the last Promote sent to it (even if frozen)
  uint64_t grants = 0;         // Grants sent to it
  uint64_t heartbeat_seq = 0;
  std::set<uint32_t> mapped;     // writable, until dead and past the barrier
  std::set<uint32_t> returning;  // given back in a ReturnExtents still on its way
  TimePoint returning_until{};
  // Set by a scenario that plays this engine's answers to Reclaims: the Reclaims it reads are
  // kept here unanswered (the scenario answers with SimWorld::GiveBack). Never in the
  // randomized simulation.
  bool holds_reclaims = false;
  std::vector<proto::Reclaim> held_reclaims;
  std::optional<FromEngine> last_sent;        // for stale replays once it is gone
  std::optional<FromEngine> standby_sent;     // a message with its epoch (0) sent as a standby
  std::shared_ptr<SimEngineKv> kv;            // its KV cache and records (sim_kv.h)
  std::optional<proto::KvAdopted> kv_report;  // adopted at its Promote, sent when it serves
  // A promotion before the barrier: the predecessor's quarantined blocks (read-only), until it
  // copied them or they came in a Grant; whether it waits for that Grant (its PromoteAck held
  // back), and what it tells the controller of it when it serves.
  std::vector<proto::BlockRange> quarantined;
  Duration wait_limit{};
  bool awaiting_inherited = false;
  std::optional<proto::KvInherited> inherit_report;
  bool clean_exit = false;  // it exited on its own after a Stop: it wrote nothing more

  bool Working() const { return alive && !hung && !killed && !exiting; }
};

// What the world hands the driver to deliver to the Coordinator.
struct WorldEvent {
  enum class Kind { kConnect, kMessage, kDisconnected, kExited, kDying };
  Kind kind = Kind::kMessage;
  EngineId id = kNoEngine;
  FromEngine message;
  std::string how;
};

// Coalesced runs of `blocks`.
inline std::vector<proto::BlockRange> Runs(const std::set<uint32_t>& blocks) {
  std::vector<proto::BlockRange> out;
  for (uint32_t b : blocks) {
    if (!out.empty() && out.back().first + out.back().count == b) {
      ++out.back().count;
    } else {
      out.push_back(proto::BlockRange{b, 1});
    }
  }
  return out;
}

// What engines send: its type's name, whether it carries an epoch and which, and a line for
// the step log.
inline const char* NameOf(const FromEngine& m) {
  static constexpr const char* kNames[] = {
      "Register",      "Reattach",    "StandbyReady", "Heartbeat", "LeaseRequest",
      "ReturnExtents", "ErrorReport", "PromoteAck",   "Drained",   "ShareMemoryAck",
      "ErrorMsg",      "KvAdopted",   "KvInherited",  "Progress"};
  static_assert(std::size(kNames) == std::variant_size_v<FromEngine>);
  return kNames[m.index()];
}

// Whether a message an engine sends carries its epoch.
inline bool CarriesEpoch(const FromEngine& m) {
  return std::visit(
      [](const auto& x) {
        return requires { x.epoch; };
      },
      m);
}

// The epoch a message carries (0 for those that carry none).
inline uint64_t EpochOf(const FromEngine& m) {
  return std::visit(
      [](const auto& x) -> uint64_t {
        if constexpr (requires { x.epoch; }) {
          return x.epoch;
        } else {
          return 0;
        }
      },
      m);
}

// "LeaseRequest epoch 3 blocks 2", "ReturnExtents epoch 3 [4, 6)": for the step log.
inline std::string Describe(const FromEngine& m) {
  std::string s = std::string(NameOf(m)) + " epoch " + std::to_string(EpochOf(m));
  if (const auto* r = std::get_if<proto::LeaseRequest>(&m)) {
    s += " blocks " + std::to_string(r->blocks);
  } else if (const auto* x = std::get_if<proto::ReturnExtents>(&m)) {
    for (const proto::BlockRange& b : x->extents) s += " " + ToString(Extent{b.first, b.count});
  }
  return s;
}

}  // namespace baton::sim
