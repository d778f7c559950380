// Simulation: one seed of the randomized fencing simulation (simulation_test.cc).
//
// It drives the production Coordinator (controller/core/coordinator.h) against SimWorld
// through SimEffects (the loop: sim_loop.h), on a fake clock, with a seeded PRNG: time
// passing, heartbeats, lease requests, returns, crashes, hangs, error reports, drills, stale
// replays, forged epochs, returns of unheld blocks, a standby asking for blocks
// (sim_driver_events.h); every operator command (switch-over, upgrade, rollback, drain,
// resume, shutdown), canaries judged on what the modelled router saw, device losses on the
// seeds that run the CUDA backend, and controller crashes: the Coordinator is destroyed and a
// new one started from what the SimDisk and the world hold, whose engines then reattach
// (sim_driver_commands.h). Serving engines generate into their KV and a promoted engine
// adopts what its predecessor left (sim_kv.h). After every step fencing rules 1-5 are checked
// twice, against the world and by the ledger's CheckInvariants, rule 6 (KV adoption) against
// the world, and the Coordinator must have refused no transition, seen no violation and
// counted no BATON_BUG; a drained pair runs no engine, outside an upgrade only the primary
// serves, and a lost device's memory is dropped only once every engine is killed
// (sim_effects.h). A final calm phase checks liveness.
//
// Ownership: a Simulation is a SimLoop, which owns its clock, world, disk, effects and
// Coordinator. Header-only
// test support; single-threaded; deterministic for a given seed.
#pragma once

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/bug.h"
#include "controller/config.h"
#include "controller/core/coordinator.h"
#include "tests/controller/sim_loop.h"
#include "tests/controller/sim_options.h"

namespace baton::sim {

// One seed: build it, Run() it once.
class Simulation : private SimLoop {
 public:
  Simulation(uint64_t seed, int steps, const Fault& fault, bool verbose)
      : SimLoop(seed, fault), steps_(steps) {
    verbose_ = verbose;
    world_.set_liveness_pages(true);
    config_.promotion_reserve_blocks =
        fault.reserve != Fault::kRandomReserve ? fault.reserve : PickReserve();
    // Half the seeds run the CUDA backend: its device memory is probed, and can be lost.
    if (rng_.Chance(50)) {
      set_cuda_backend(true);
      config_.gpu_probe_interval = milliseconds(100);
    }
    if (verbose_) world_.SetTrace(&out_.log);
    StartController(/*restart=*/false, /*memory_kept=*/false);
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
    // run out), until the pair is ready with nothing quarantined and no upgrade in flight
    // (the routers' traffic judges a canary to its end); a drain left behind is resumed.
    for (int i = 0; i < 400 && out_.ok && (i < 40 || !Quiet()); ++i) {
      if (i % 10 == 0) ResumeIfStopped();
      AdvanceTime(milliseconds(50), /*slow=*/false);
      CheckStep(-1);
    }
    if (out_.ok && !Quiet()) {
      Fail(-1, std::string("liveness: pair still ") + ToString(coord_->pair_state()) +
                   (coord_->recovering() ? ", recovering," : "") + Upgrading() + " with " +
                   std::to_string(coord_->ledger().Snapshot().quarantined_blocks) +
                   " quarantined blocks after settling");
    }
    // No block is stranded: the free blocks beside the reserve are the primary's but for
    // those an engine gave up of its own accord (they may stay free).
    const uint32_t stranded = coord_->ledger().GrantableTo(coord_->primary());
    const auto given_up_free =
        std::count_if(given_up_.begin(), given_up_.end(),
                      [this](uint32_t b) { return coord_->ledger().UsedBy(b) == kNoEngine; });
    if (out_.ok && config_.initial_grant_blocks == 0 && stranded > given_up_free) {
      Fail(-1, "liveness: " + std::to_string(stranded) +
                   " free blocks beside the reserve were not granted to primary engine " +
                   std::to_string(coord_->primary()) + " after settling (" +
                   std::to_string(given_up_free) + " of them given up by an engine)");
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
    out_.stats.inherit_timed_out = kv.inherit_timed_out;
    out_.stats.kv_copied = kv.kv_copied, out_.stats.kv_changed = kv.kv_changed;
    for (const auto& [id, e] : world_.engines()) out_.stats.ghost_steps += e.kv->ghost_steps();
    SaveCounts();
    out_.stats.upgrades_promoted = counts().upgrades_promoted;
    out_.stats.upgrades_rolled_back = counts().upgrades_rolled_back;
    out_.stats.device_losses = counts().device_losses;
    out_.stats.device_rebuilds = counts().device_rebuilds;
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

  // After every call into the Coordinator: what its kills say of its hang detection.
  void AfterCallHook() override {
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
  void DeliverMessage(EngineId id, const FromEngine& m, const char* what) override {
    (void)Deliver(id, m, /*stale=*/false, what);
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
      // Taken back, or taken and given straight back (a return the Coordinator took for the
      // answer to a Reclaim whose upgrade has ended goes back to the primary at once).
      le = coord_->ledger().engine(id);  // (a fence may have emptied it too)
      accepted = le != nullptr && le->role == LedgerRole::kHolder &&
                 (le->blocks < blocks || (e != nullptr && e->grants > grants));
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
    if (!coord_->invariants().ok()) return Fail(step, coord_->invariants().message());
    if (coord_->refused_transitions() != 0) {
      return Fail(step, "model: the coordinator refused " +
                            std::to_string(coord_->refused_transitions()) +
                            " state transitions (see its ERROR log)");
    }
    if (BugCount() != bugs_at_start_) {  // counted, not aborting, in the mutants' runs only
      return Fail(step, "bug: the coordinator reported " +
                            std::to_string(BugCount() - bugs_at_start_) +
                            " BATON_BUGs (BATON_LOG_LEVEL=error shows them)");
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
    if (std::string v = CheckPairShape(s); !v.empty()) return Fail(step, v);
  }
  // What the operator's commands promise of the engines left running (docs/operations.md):
  // a drained pair runs none, and outside an upgrade only the primary serves new requests (a
  // rolled-back canary is drained and retired; a switch-over's old primary drains).
  std::string CheckPairShape(PairState s) {
    EngineId serving = kNoEngine;
    for (const auto& [id, e] : world_.engines()) {
      if (s == PairState::kStopped && e.alive && !e.killed && !e.exiting) {
        return "drain: the pair is stopped but engine " + std::to_string(id) + " still runs";
      }
      if (!e.Working() || !e.serving || e.draining) continue;
      if (serving == kNoEngine) {
        serving = id;
        continue;
      }
      if (coord_->recovering() || coord_->Snapshot().upgrade.has_value()) continue;
      return "rollout: engines " + std::to_string(serving) + " and " + std::to_string(id) +
             " both serve new requests with no upgrade in flight";
    }
    return "";
  }
  // A ready standby, or a canary, which holds the standby's place during an upgrade.
  bool HasStandby() {
    for (const auto& [id, e] : world_.engines()) {
      const EngineRecord* r = coord_->engine(id);
      if (r == nullptr || !r->live()) continue;
      if (r->is(EngineState::kStandby)) return true;
      const bool canary = id != coord_->primary() &&
                          (r->is(EngineState::kPromoting) || r->is(EngineState::kPrimary) ||
                           r->is(EngineState::kDraining));
      if (canary) return true;
    }
    return false;
  }
  // ", upgrading (phase, judgement)," while an upgrade runs; "" otherwise.
  std::string Upgrading() const {
    const std::optional<UpgradeStatus> u = coord_->Snapshot().upgrade;
    if (!u.has_value()) return "";
    std::string seen;
    if (u->canary_seen.has_value()) {
      seen = "; the router saw " + std::to_string(u->canary_seen->requests) +
             " requests on the canary, " + std::to_string(u->canary_seen->errors) + " failed";
    }
    return std::string(", upgrading (") + ToString(u->phase) + " at " + std::to_string(u->weight) +
           " %: " + u->judgement + seen + "),";
  }
  // The pair ready with nothing quarantined, no recovery and no upgrade in flight.
  bool Quiet() const {
    return coord_->pair_state() == PairState::kReady && !coord_->recovering() &&
           coord_->ledger().Snapshot().quarantined_blocks == 0 &&
           !coord_->Snapshot().upgrade.has_value();
  }
  void Fail(int step, const std::string& violation) {
    out_.ok = false;
    out_.step = step;
    out_.violation = violation;
  }
  void Note(const std::string& what) override {
    if (!verbose_) return;
    out_.log.push_back("step " + std::to_string(step_) + " t=" + std::to_string(world_.Millis()) +
                       "ms " + what + " -> pair " + ToString(coord_->pair_state()));
  }

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

  // --- events (sim_driver_events.h) --------------------------------------------------------
  void RandomEvent();
  void AdvanceTime(Duration d, bool slow);
  void RequestGrant();
  void ReturnBlocks();
  void CrashPrimary();
  void Crash(EngineId id, const char* role);
  void Hang();
  void ReportError();
  void ReplayStale();
  void Forge();
  void ReturnUnheld();
  void StandbyAsksForBlocks();
  // --- operator commands and the controller's life (sim_driver_commands.h) -----------------
  void GracefulPromote();
  void Upgrade();
  void UpgradeToAMissingProgram();
  void Rollback();
  void DrainOrResume();
  void ResumeIfStopped();
  void LoseDevice();
  void CrashController();
  void StopAndStartAgain();

  int steps_;
  int step_ = 0;                         // -1 while settling
  std::set<uint32_t> given_up_;          // blocks an engine returned of its own accord
  uint64_t bugs_at_start_ = BugCount();  // base/bug.h
  uint64_t versions_ = 1;                // the last engine version an upgrade asked for
  Outcome out_;
};

}  // namespace baton::sim

#include "tests/controller/sim_driver_commands.h"  // IWYU pragma: export
#include "tests/controller/sim_driver_events.h"    // IWYU pragma: export
