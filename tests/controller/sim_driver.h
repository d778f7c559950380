// Simulation: one seed of the randomized fencing simulation (simulation_test.cc).
//
// It drives the production Coordinator (controller/core/coordinator.h) against SimWorld
// through SimEffects, on a fake clock, with a seeded PRNG: time passing (with the
// Coordinator's timer honoured at NextWakeup, and the world's queued replies, closed
// connections and exits delivered as events when due), heartbeats, lease requests, returns,
// crashes, hangs, error reports, drills, stale replays, forged epochs, returns of unheld
// blocks, a standby asking for blocks, planned switch-overs, and controller crashes: the
// Coordinator is destroyed and a new one started from what the SimDisk and the world hold,
// whose engines then reattach. Serving engines generate into their KV and a promoted engine
// adopts what its predecessor left (sim_kv.h). After every step fencing rules 1-5 are checked
// twice, against the world and by the ledger's CheckInvariants, rule 6 (KV adoption) against
// the world, and the Coordinator must have refused no transition and seen no violation. A
// final calm phase checks liveness.
//
// Ownership: a Simulation owns its clock, world, disk, effects and Coordinator. Header-only
// test support; single-threaded; deterministic for a given seed.
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

// One seed: build it, Run() it once.
class Simulation {
 public:
  Simulation(uint64_t seed, int steps, const Fault& fault, bool verbose)
      : rng_(seed),
        world_(clock_, store_, rng_, fault.blocks, fault.blocks_per_chunk),
        effects_(world_, disk_, SimFaults{fault.skip_barrier, fault.release_at_once}),
        config_(SimConfig(fault)),
        fault_(fault),
        steps_(steps),
        verbose_(verbose) {
    store_.skip_fsync = fault.skip_fsync;
    config_.promotion_reserve_blocks =
        fault.reserve != Fault::kRandomReserve ? fault.reserve : PickReserve();
    if (verbose_) world_.SetTrace(&out_.log);
    StartController(/*restart=*/false);
  }

  Outcome Run() {
    for (int step = 0; step < steps_ && out_.ok; ++step) {
      step_ = step;
      RandomEvent();
      RunFor(Duration::zero());
      CheckStep(step);
    }
    step_ = -1;
    // Calm: no faults, time passes (2 s at least: every timeout, detector and barrier has
    // run out), until the pair is ready with nothing quarantined.
    for (int i = 0; i < 400 && out_.ok && (i < 40 || !Quiet()); ++i) {
      AdvanceTime(milliseconds(50), /*slow=*/false);
      CheckStep(-1);
    }
    if (out_.ok && !Quiet()) {
      Fail(-1, std::string("liveness: pair still ") + ToString(coord_->pair_state()) +
                   (coord_->recovering() ? ", recovering," : "") + " with " +
                   std::to_string(coord_->ledger().Snapshot().quarantined_blocks) +
                   " quarantined blocks after settling");
    }
    // The routers were told: the last table sends traffic to the primary.
    const std::optional<proto::RouteTable>& routes = effects_.routes();
    const bool routed =
        routes.has_value() && std::any_of(routes->entries.begin(), routes->entries.end(),
                                          [this](const proto::RouteEntry& r) {
                                            return r.engine_id == coord_->primary() &&
                                                   r.role == proto::EngineRole::kPrimary &&
                                                   r.ready && r.weight == 100;
                                          });
    if (out_.ok && !routed) {
      Fail(-1, "liveness: the last route table does not send traffic to primary engine " +
                   std::to_string(coord_->primary()));
    }
    // Nothing left behind: the only processes running are the pair's two, both answering.
    for (const auto& [id, e] : world_.engines()) {
      if (out_.ok && e.alive && !Talking(e)) {
        Fail(-1, "liveness: engine " + std::to_string(id) + " still runs after settling (" +
                     (e.hung                  ? "hung"
                      : e.killed || e.exiting ? "fenced"
                                              : "not attached") +
                     ")");
      }
    }
    out_.stats.promotions = world_.promotions;
    out_.stats.readopts = effects_.reattach_acks();
    const Stats& kv = world_.kv_stats;
    out_.stats.kv_adopted = kv.kv_adopted, out_.stats.kv_dropped = kv.kv_dropped;
    out_.stats.kv_torn = kv.kv_torn, out_.stats.kv_continued = kv.kv_continued;
    out_.stats.kv_malformed = kv.kv_malformed;
    out_.stats.before_barrier = kv.before_barrier, out_.stats.after_barrier = kv.after_barrier;
    out_.stats.inherit_copied = kv.inherit_copied, out_.stats.inherit_waited = kv.inherit_waited;
    out_.stats.kv_copied = kv.kv_copied, out_.stats.kv_changed = kv.kv_changed;
    for (const auto& [id, e] : world_.engines()) out_.stats.ghost_steps += e.kv->ghost_steps();
    return std::move(out_);
  }

 private:
  // The seed's promotion reserve: mostly a small one (the default among them), now and then
  // none or one too large for the pool (promotions then wait for the barrier).
  int PickReserve() {
    const uint64_t r = rng_.Range(0, 9);
    if (r == 0) return 0;
    if (r == 1) return static_cast<int>(fault_.blocks);  // more than half: no reserve
    if (r < 5) return -1;
    return static_cast<int>(rng_.Range(1, fault_.blocks / 4));
  }

  // --- the controller ---------------------------------------------------------------------
  void StartController(bool restart) {
    StartState s{.incarnation = ++disk_.incarnation,
                 .exec_at = clock_.Now(),
                 .roster = restart ? disk_.roster : std::nullopt,
                 .roster_refused = "",
                 .alive = {},
                 .memory_adopted = restart,  // the pool and the weights outlive the controller
                 .memory_reason = restart ? "" : "a fresh start",
                 .arena_dev = kArenaDev,
                 .arena_ino = kArenaIno,
                 .pool_dev = kPoolDev,
                 .pool_ino = kPoolIno,
                 .commands = disk_.commands,
                 .commands_error = "",
                 .blocks_per_chunk = fault_.blocks_per_chunk,
                 .cuda_backend = false};
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
    coord_->Start(s);
    last_tick_ = TimePoint{};
    AfterCall();
  }
  void RestartController() {
    ++out_.stats.restarts;
    coord_.reset();  // its memory is gone; the disk, the journal and the engines stay
    (void)effects_.TakeKills();
    store_.Restart();
    world_.ControllerRestarted();
    StartController(/*restart=*/true);
    Note("controller restarts at durable epoch " + std::to_string(store_.current()));
  }

  // After every call into the Coordinator: its timer re-armed (a tick that asks for the same
  // instant again gets the next millisecond), and what its kills say of its hang detection.
  void AfterCall() {
    wake_at_ = coord_->NextWakeup();
    if (wake_at_ <= last_tick_) wake_at_ = last_tick_ + milliseconds(1);
    for (const SimEffects::KillRecord& k : effects_.TakeKills()) {
      const EngineRecord* r = coord_->engine(k.id);
      if (r == nullptr || r->fail_cause != FailCause::kHung) continue;
      ++out_.stats.hang_kills;
      if (k.was_working) {
        world_.Flag("model: a live, answering engine " + std::to_string(k.id) +
                    " was killed as hung");
      }
    }
  }

  // --- time and the world's events -------------------------------------------------------
  // Runs the world and the Coordinator's timer for `d`, delivering what falls due. The timer
  // is armed, as the daemon arms it, at NextWakeup() after every call into the Coordinator.
  void RunFor(Duration d) {
    const TimePoint end = clock_.Now() + d;
    for (;;) {
      DeliverDue();
      const TimePoint now = clock_.Now();
      if (now >= wake_at_) {
        last_tick_ = now;
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
          Deliver(ev->id, ev->message, /*stale=*/false, "sends");
          break;
        case WorldEvent::Kind::kDisconnected:
          coord_->OnDisconnected(ev->id, ev->how, /*error=*/false);
          if (verbose_) Note(Id(ev->id) + " connection closed");
          break;
        case WorldEvent::Kind::kExited:
          coord_->OnExited(ev->id, ev->how);
          if (verbose_) Note(Id(ev->id) + " reaped: " + ev->how);
          break;
      }
      AfterCall();
    }
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
    coord_->OnConnected(id, proto::kProtocolVersionMax);
    const FromEngine opening = world_.Opening(*e);
    world_.Note(*e, opening);
    Deliver(id, opening, /*stale=*/false, "connects and sends");
  }

  // --- delivering engine messages, judged against the world -------------------------------
  // Ground truth, taken when the message is made: stale if its sender was fenced (killed, or
  // told to stop) or the epoch is not the one the sender holds. (Not a message from an engine
  // that crashed on its own: the controller cannot have fenced it yet; nor one at epoch 0
  // from an engine promoted but not serving yet: it may have been sent before the Promote
  // arrived.)
  bool IsStale(EngineId id, uint64_t epoch) {
    const SimEngine* e = world_.Find(id);
    if (e == nullptr || e->killed || e->stop_received) return true;
    return epoch != e->epoch && !(epoch == 0 && e->promoted && !e->serving);
  }
  // Delivers `m` from `id` and returns whether the Coordinator acted on it (a heartbeat
  // counted, a lease granted, blocks taken back). A stale message must not be acted on, and
  // its sender, if the Coordinator held it serving, must be told to stop (rule 4).
  bool Deliver(EngineId id, const FromEngine& m, bool stale, const char* what) {
    const EngineRecord* before = coord_->engine(id);
    const uint64_t heartbeats = before != nullptr ? before->heartbeats : 0;
    const bool serving = before != nullptr && before->live() && before->connected &&
                         (before->is(EngineState::kPrimary) || before->is(EngineState::kDraining));
    const LedgerEngine* le = coord_->ledger().engine(id);
    const uint32_t blocks = le != nullptr ? le->blocks : 0;
    SimEngine* e = world_.Find(id);
    const uint64_t grants = e != nullptr ? e->grants : 0;
    coord_->OnMessage(id, m);
    AfterCall();
    bool accepted = false;
    if (std::holds_alternative<proto::Heartbeat>(m)) {
      const EngineRecord* after = coord_->engine(id);
      accepted = after != nullptr && after->heartbeats > heartbeats;
    } else if (std::holds_alternative<proto::LeaseRequest>(m)) {
      accepted = e != nullptr && e->grants > grants;
    } else if (std::holds_alternative<proto::ReturnExtents>(m)) {
      le = coord_->ledger().engine(id);  // (a fence may have emptied it too)
      accepted = le != nullptr && le->role == LedgerRole::kHolder && le->blocks < blocks;
    }
    if (stale && accepted) {
      world_.Flag("invariant 4 (stale messages refused): accepted a stale " +
                  std::string(NameOf(m)) + " from engine " + std::to_string(id) + " at epoch " +
                  std::to_string(EpochOf(m)));
    }
    if (stale && serving && CarriesEpoch(m) && e != nullptr && e->alive && !e->killed &&
        !e->stop_received) {
      world_.Flag("invariant 4 (stale messages refused): engine " + std::to_string(id) +
                  " sent epoch " + std::to_string(EpochOf(m)) + " (it holds " +
                  std::to_string(e->epoch) + ") and was not told to stop");
    }
    if (verbose_) {
      Note(Id(id) + " " + what + " " + Describe(m) + (stale ? " (stale)" : "") +
           (accepted ? ": acted on" : ""));
    }
    return accepted;
  }

  // --- checks -----------------------------------------------------------------------------
  void CheckStep(int step) {
    world_.Prune();
    ++out_.stats.steps;
    const PairState s = coord_->pair_state();
    out_.stats.backoff_steps += s == PairState::kDegradedBackoff || s == PairState::kDownBackoff;
    if (Status st = world_.Check(); !st.ok()) return Fail(step, st.message());
    if (Status st = coord_->ledger().CheckInvariants(); !st.ok()) return Fail(step, st.message());
    if (coord_->invariants() != "ok") return Fail(step, coord_->invariants());
    if (coord_->refused_transitions() != 0) {
      return Fail(step, "model: the coordinator refused " +
                            std::to_string(coord_->refused_transitions()) +
                            " state transitions (see its ERROR log)");
    }
    if (!effects_.refused_reattach().empty()) {
      return Fail(step, "recovery: an engine reattached with the truth and was refused: " +
                            effects_.refused_reattach());
    }
    if (Status st = CheckAdoptedHeld(world_.engines(), *coord_); !st.ok()) {
      return Fail(step, st.message());
    }
    if (s == PairState::kReady && !HasStandby()) {
      return Fail(step, "model: pair ready without a ready standby");
    }
    if (PairServes(s) != (coord_->primary() != kNoEngine)) {
      return Fail(step,
                  std::string("model: pair ") + ToString(s) +
                      (coord_->primary() != kNoEngine ? " with a primary" : " without a primary"));
    }
  }
  bool HasStandby() {
    for (const auto& [id, e] : world_.engines()) {
      const EngineRecord* r = coord_->engine(id);
      if (r != nullptr && r->is(EngineState::kStandby)) return true;
    }
    return false;
  }
  bool Quiet() const {
    return coord_->pair_state() == PairState::kReady && !coord_->recovering() &&
           coord_->ledger().Snapshot().quarantined_blocks == 0;
  }
  void Fail(int step, const std::string& violation) {
    out_.ok = false;
    out_.step = step;
    out_.violation = violation;
  }
  void Note(const std::string& what) {
    if (!verbose_) return;
    out_.log.push_back("step " + std::to_string(step_) + " t=" + std::to_string(world_.Millis()) +
                       "ms " + what + " -> pair " + ToString(coord_->pair_state()));
  }
  static std::string Id(EngineId id) { return "engine " + std::to_string(id); }

  // --- engines as the ground truth sees them ----------------------------------------------
  template <typename Pred>
  EngineId Pick(Pred pred) {
    std::vector<EngineId> ids;
    for (auto& [id, e] : world_.engines()) {
      if (pred(e)) ids.push_back(id);
    }
    return ids.empty() ? kNoEngine : ids[rng_.Range(0, ids.size() - 1)];
  }
  static bool Talking(const SimEngine& e) { return e.Working() && e.attached; }
  EngineId PickPrimary() {
    return Pick([](const SimEngine& e) { return Talking(e) && e.promoted; });
  }
  EngineId PickStandby() {
    return Pick([](const SimEngine& e) { return Talking(e) && !e.promoted; });
  }

  // --- events -------------------------------------------------------------------------------
  void RandomEvent() {
    const uint64_t r = rng_.Range(0, 99);
    if (r < 30) return AdvanceTime(rng_.Millis(1, 100), /*slow=*/true);
    if (r < 44) return RequestGrant();
    if (r < 56) return ReturnBlocks();
    if (r < 60) return CrashPrimary();
    if (r < 63) return Crash(PickStandby(), "standby");
    if (r < 65) return Crash(Pick([](const SimEngine& e) { return e.alive; }), "any");
    if (r < 68) return Hang();
    if (r < 70) return ReportError();
    if (r < 72) return RestartController();
    if (r < 78) return ReplayStale();
    if (r < 83) return Forge();
    if (r < 87) return ReturnUnheld();
    if (r < 91) return StandbyAsksForBlocks();
    if (r < 93) return GracefulPromote();
    return AdvanceTime(rng_.Millis(100, 400), /*slow=*/true);
  }

  // Time passes; then every engine that talks to the controller sends a heartbeat (a slow
  // one sometimes misses it).
  void AdvanceTime(Duration d, bool slow) {
    world_.Generate();
    RunFor(d);
    if (verbose_) Note("time +" + std::to_string(d.count() / 1000000) + "ms");
    for (auto& [id, e] : world_.engines()) {
      if (!Talking(e) || (slow && rng_.Chance(10))) continue;
      world_.Send(e, proto::Heartbeat{.epoch = e.epoch, .seq = ++e.heartbeat_seq},
                  rng_.Millis(0, 2));
    }
    RunFor(Duration::zero());
  }
  void RequestGrant() {
    const EngineId id = PickPrimary();
    if (id == kNoEngine) return;
    SimEngine& e = *world_.Find(id);
    const proto::LeaseRequest m{.epoch = e.epoch,
                                .blocks = static_cast<uint32_t>(rng_.Range(1, 8))};
    world_.Note(e, m);
    (void)Deliver(id, m, false, "asks:");
  }
  void ReturnBlocks() {
    const EngineId id = PickPrimary();
    if (id == kNoEngine) return;
    SimEngine& e = *world_.Find(id);
    if (e.mapped.empty()) return;
    auto it = e.mapped.begin();
    std::advance(it, rng_.Range(0, e.mapped.size() - 1));
    std::set<uint32_t> give{*it};
    const uint32_t want = static_cast<uint32_t>(rng_.Range(1, 6));
    while (give.size() < want && e.mapped.count(*give.rbegin() + 1))
      give.insert(*give.rbegin() + 1);
    e.kv->Give(give);
    for (uint32_t b : give) e.mapped.erase(b);  // unmapped before it says so
    const proto::ReturnExtents m{.epoch = e.epoch, .extents = Runs(give)};
    world_.Note(e, m);
    if (!Deliver(id, m, false, "returns:")) {
      world_.Flag("model: engine " + std::to_string(id) + "'s valid return was refused");
    }
  }
  void CrashPrimary() {
    if (rng_.Chance(20) && coord_->Drill(DrillKind::kKill).ok()) return Note("drill kill");
    Crash(PickPrimary(), "primary");
  }
  void Crash(EngineId id, const char* role) {
    if (id == kNoEngine) return;
    world_.Crash(id);
    Note(Id(id) + " (" + role + ") crashes");
  }
  void Hang() {
    if (rng_.Chance(10) && coord_->Drill(DrillKind::kHang).ok()) return Note("drill hang");
    const EngineId id = Pick([](const SimEngine& e) { return e.Working(); });
    if (id == kNoEngine) return;
    world_.Hang(id);
    Note(Id(id) + " hangs");
  }
  void ReportError() {
    if (rng_.Chance(20) && coord_->Drill(DrillKind::kError).ok()) return Note("drill error");
    const EngineId id = PickPrimary();
    if (id == kNoEngine) return;
    SimEngine& e = *world_.Find(id);
    const proto::ErrorReport m{.epoch = e.epoch, .code = 13, .message = "device error"};
    world_.Note(e, m);
    (void)Deliver(id, m, false, "reports");
  }
  // An old message again: from an engine that is gone, or one sent as a standby by an
  // engine that now serves.
  void ReplayStale() {
    if (rng_.Chance(50)) {
      const EngineId id = Pick([](const SimEngine& e) { return !e.Working() && e.last_sent; });
      if (id == kNoEngine) return;
      const FromEngine m = *world_.Find(id)->last_sent;
      out_.stats.refused_stale += !Deliver(id, m, IsStale(id, EpochOf(m)), "replays");
      return;
    }
    const EngineId id = Pick([this](const SimEngine& e) {
      const EngineRecord* r = coord_->engine(e.id);
      return Talking(e) && e.promoted && e.standby_sent && r != nullptr &&
             (r->is(EngineState::kPrimary) || r->is(EngineState::kDraining));
    });
    if (id == kNoEngine) return;
    const FromEngine m = *world_.Find(id)->standby_sent;
    out_.stats.refused_stale += !Deliver(id, m, IsStale(id, EpochOf(m)), "replays");
  }
  void Forge() {
    const EngineId id = PickPrimary();
    if (id == kNoEngine) return;
    const uint64_t epoch = world_.Find(id)->epoch;
    const uint64_t forged = rng_.Chance(50) || epoch == 1 ? epoch + 1 : epoch - 1;
    FromEngine m = proto::LeaseRequest{.epoch = forged, .blocks = 1};
    if (rng_.Chance(50)) m = proto::ReturnExtents{.epoch = forged, .extents = {{0, 1}}};
    out_.stats.refused_forged += !Deliver(id, m, true, "forges");
  }
  void ReturnUnheld() {
    const EngineId id = rng_.Chance(70) ? PickPrimary() : PickStandby();
    if (id == kNoEngine) return;
    SimEngine& e = *world_.Find(id);
    proto::BlockRange x{static_cast<uint32_t>(rng_.Range(0, fault_.blocks - 1)), 1};
    const bool returning = clock_.Now() < e.returning_until && e.returning.count(x.first) != 0;
    if (e.mapped.count(x.first) || returning) {
      x = proto::BlockRange{fault_.blocks - 1, 3};  // past the end
    }
    const bool accepted = Deliver(id, proto::ReturnExtents{.epoch = e.epoch, .extents = {x}}, false,
                                  "returns unheld blocks:");
    out_.stats.refused_forged += !accepted;
    if (accepted) {
      world_.Flag("refusal: engine " + std::to_string(id) + " returned blocks " +
                  ToString(Extent{x.first, x.count}) + " it does not map and it was accepted");
    }
  }
  void StandbyAsksForBlocks() {
    const EngineId id = PickStandby();
    if (id == kNoEngine) return;
    (void)Deliver(id, proto::LeaseRequest{.epoch = 0, .blocks = 2}, false, "(standby) asks for");
  }
  void GracefulPromote() {
    const Status status = coord_->RequestSwitchover();
    out_.stats.switchovers += status.ok();
    Note("batonctl promote: " + status.ToString());
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
  int steps_;
  int step_ = 0;  // -1 while settling
  bool verbose_;
  Outcome out_;
};

}  // namespace baton::sim
