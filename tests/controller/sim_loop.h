// SimLoop: the production Coordinator (controller/core/coordinator.h) run against SimWorld
// through SimEffects on a fake clock, as the daemon runs it against real processes: the
// Coordinator's timer honoured at NextWakeup, and the world's queued replies, closed
// connections and exits delivered as events when due. It starts the controller, crashes and
// restarts it (the Coordinator destroyed and a new one started from what the SimDisk and the
// world hold), and shuts it down as the daemon does (BeginShutdown, the grace, SIGKILL to
// what is left). The randomized simulation (sim_driver.h) and the scenario tests
// (tests/controller/core/scenario_*_test.cc) both drive it.
//
// Ownership: a SimLoop owns its clock, Rng, epoch store, world, disk, effects and
// Coordinator. Header-only test support; single-threaded; deterministic for a given seed.
#pragma once

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "controller/config.h"
#include "controller/core/coordinator.h"
#include "tests/controller/sim_effects.h"
#include "tests/controller/sim_options.h"
#include "tests/controller/sim_world.h"

namespace baton::sim {

class SimLoop {
 public:
  SimLoop(uint64_t seed, const Fault& fault)
      : rng_(seed),
        world_(clock_, store_, rng_, fault.blocks, fault.blocks_per_chunk),
        effects_(world_, disk_, SimFaults{fault.skip_barrier, fault.release_at_once}),
        config_(SimConfig(fault)),
        fault_(fault) {
    store_.skip_fsync = fault.skip_fsync;
  }
  virtual ~SimLoop() = default;
  SimLoop(const SimLoop&) = delete;
  SimLoop& operator=(const SimLoop&) = delete;

  // --- the controller ---------------------------------------------------------------------
  // Starts a Coordinator: fresh, or (`restart`) from the roster and command record on the
  // disk, with the pool and the weights kept (`memory_kept`) or not.
  void StartController(bool restart, bool memory_kept) {
    StartState s{.incarnation = ++disk_.incarnation,
                 .exec_at = clock_.Now(),
                 .roster = restart ? disk_.roster : std::nullopt,
                 .roster_refused = "",
                 .alive = {},
                 .memory_adopted = memory_kept,
                 .memory_reason = memory_kept ? "" : "a fresh start",
                 .arena_dev = kArenaDev,
                 .arena_ino = kArenaIno,
                 .pool_dev = kPoolDev,
                 .pool_ino = kPoolIno,
                 .holders_killed = {},
                 .commands = disk_.commands,
                 .commands_error = "",
                 .blocks_per_chunk = fault_.blocks_per_chunk,
                 .cuda_backend = cuda_backend_};
    if (s.roster.has_value()) {
      for (const RosterEngine& r : s.roster->engines) {
        const SimEngine* e = world_.Find(r.id);
        s.alive[r.id] = e != nullptr && e->alive;
      }
    }
    coord_ = std::make_unique<Coordinator>(config_, clock_, store_, effects_);
    if (fault_.mutation != PoolLedger::Mutation::kNone) {
      coord_->SetLedgerMutationForTesting(fault_.mutation);
    }
    if (fault_.part != CoordinatorMutation::kNone) coord_->SetMutationForTesting(fault_.part);
    coord_->Start(s);
    last_tick_ = TimePoint{};
    wake_at_ = TimePoint::max();  // a new controller: its own timer
    AfterCall();
  }
  // The controller crashes (kill -9) and its successor starts: its memory is gone; the disk,
  // the journal, the pool and the engines stay.
  void RestartController() {
    EndController();
    world_.ControllerRestarted();
    StartController(/*restart=*/true, /*memory_kept=*/true);
    Note("controller restarts at durable epoch " + std::to_string(store_.current()));
  }
  // `batonctl stop`, as Controller::Shutdown does it: every engine told to stop, their exits
  // awaited for the grace (no timer: the daemon cancels its tick), then SIGKILL to the rest.
  void ShutDown(Duration grace) {
    coord_->BeginShutdown();
    AfterCall();
    const TimePoint end = clock_.Now() + grace;
    while (!coord_->Remaining().empty() && clock_.Now() < end) {
      DeliverDue();
      clock_.Set(std::min(end, std::max(clock_.Now() + milliseconds(1), world_.NextEventAt())));
    }
    DeliverDue();
    for (EngineId id : coord_->Remaining()) {
      world_.Reap(id);
      coord_->OnExited(id, "killed by signal 9 after the grace");
      AfterCall();
    }
  }
  // The controller is gone (its Coordinator destroyed), what it left stays.
  void EndController() {
    SaveCounts();
    coord_.reset();
    (void)effects_.TakeKills();
    store_.Restart();
  }

  // --- time and the world's events -------------------------------------------------------
  // Runs the world and the Coordinator's timer for `d`, delivering what falls due.
  void RunFor(Duration d) {
    const TimePoint end = clock_.Now() + d;
    for (;;) {
      DeliverDue();
      const TimePoint now = clock_.Now();
      if (now >= wake_at_) {
        last_tick_ = now;
        wake_at_ = TimePoint::max();  // fired: AfterCall arms the next
        coord_->OnTick();
        AfterCall();
        continue;
      }
      const TimePoint next = std::min({end, wake_at_, world_.NextEventAt()});
      if (next <= now) break;
      clock_.Set(next);
    }
  }
  void DeliverDue() {
    for (;;) {
      world_.Settle();
      std::optional<WorldEvent> ev = world_.PopDue();
      if (!ev.has_value()) return;
      switch (ev->kind) {
        case WorldEvent::Kind::kConnect:
          Connect(ev->id);
          break;
        case WorldEvent::Kind::kMessage:
          DeliverMessage(ev->id, ev->message, "sends");
          break;
        case WorldEvent::Kind::kDisconnected:
          coord_->OnDisconnected(ev->id, ev->how, /*error=*/false);
          if (verbose_) Note(Id(ev->id) + " connection closed");
          break;
        case WorldEvent::Kind::kDying:
          coord_->OnDying(ev->id, ev->how);
          if (verbose_) Note(Id(ev->id) + " dying: " + ev->how);
          break;
        case WorldEvent::Kind::kExited:
          coord_->OnExited(ev->id, ev->how);
          if (verbose_) Note(Id(ev->id) + " reaped: " + ev->how);
          break;
      }
      AfterCall();
    }
  }

  Coordinator& coordinator() { return *coord_; }
  SimWorld& world() { return world_; }
  const SimDisk& disk() const { return disk_; }
  SimDisk& mutable_disk() { return disk_; }
  SimEffects& effects() { return effects_; }
  SimEpochStore& store() { return store_; }
  FakeClock& clock() { return clock_; }
  ControllerConfig& config() { return config_; }
  // Whether the controller runs the CUDA backend (device memory to lose); set before Start.
  void set_cuda_backend(bool cuda) { cuda_backend_ = cuda; }
  // The protocol version the engines agree on at their Hello (default: this build's newest).
  void set_engine_protocol(uint16_t version) { engine_protocol_ = version; }
  // What the controllers of this run counted (each incarnation's, summed at its end).
  const CoordinatorStatus& counts() const { return counts_; }
  void SaveCounts() {
    if (coord_ == nullptr) return;
    const CoordinatorStatus s = coord_->Snapshot();
    counts_.upgrades_promoted += s.upgrades_promoted;
    counts_.upgrades_rolled_back += s.upgrades_rolled_back;
    counts_.device_losses += s.device_losses;
    counts_.device_rebuilds += s.device_rebuilds;
  }

 protected:
  // A message from an engine, handed to the Coordinator (the simulation judges it too).
  virtual void DeliverMessage(EngineId id, const FromEngine& m, const char* /*what*/) {
    coord_->OnMessage(id, m);
    AfterCall();
  }
  // After every call into the Coordinator (the simulation reads its kills).
  virtual void AfterCallHook() {}
  virtual void Note(const std::string& /*what*/) {}
  static std::string Id(EngineId id) { return "engine " + std::to_string(id); }

  // After every call into the Coordinator: its timer re-armed as Controller::ArmTick does it
  // (a timer still pending that falls no later stays, even one due that has not fired; a tick
  // that asks for the same instant again gets the next millisecond).
  void AfterCall() {
    const TimePoint when = coord_->NextWakeup();
    if (when < wake_at_) wake_at_ = when;
    if (wake_at_ <= last_tick_) wake_at_ = last_tick_ + milliseconds(1);
    AfterCallHook();
  }
  void Connect(EngineId id) {
    SimEngine* e = world_.Find(id);
    if (e == nullptr || !e->Working() || e->connected) return;
    Result<EngineId> admitted = coord_->Admit(e->token);
    if (!admitted.ok() || *admitted != id) {
      Note(Id(id) + " Hello refused: " + admitted.status().ToString());
      return;
    }
    e->connected = true;
    coord_->OnConnected(id, engine_protocol_);
    const FromEngine opening = world_.Opening(*e);
    world_.Note(*e, opening);
    DeliverMessage(id, opening, "connects and sends");
  }

  FakeClock clock_;
  Rng rng_;
  SimEpochStore store_;
  SimWorld world_;
  SimDisk disk_;
  SimEffects effects_;
  ControllerConfig config_;
  Fault fault_;
  std::unique_ptr<Coordinator> coord_;
  TimePoint last_tick_{};
  TimePoint wake_at_{};  // the Coordinator's timer
  bool verbose_ = false;
  bool cuda_backend_ = false;
  uint16_t engine_protocol_ = proto::kProtocolVersionMax;
  CoordinatorStatus counts_;
};

}  // namespace baton::sim
