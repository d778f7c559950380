// SimController: the controller's decision logic, as the simulation drives it.
//
// It composes the production pieces (PoolLedger, EpochStore, pair and engine state
// machines, FailureDetector, CrashLoopGuard) in the order the daemon must follow:
// kill before fence, fence at a durable epoch before promoting, release quarantined blocks
// only after reap and barrier, and after a restart start in recovery, re-adopt only engines
// at the durable epoch and kill every other previous-incarnation process before freeing
// blocks. It reaches engines only through SimWorld (launch, kill, reap, barrier, deliver).
// A refused state-machine transition or ledger call it did not expect is recorded as a model
// error, so the tables are exercised by the simulation too.
//
// Header-only test support; single-threaded.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>

#include "controller/core/crash_loop_guard.h"
#include "controller/core/failure_detector.h"
#include "controller/core/pair_state.h"
#include "controller/core/pool_ledger.h"
#include "tests/controller/sim_world.h"

namespace baton::sim {

struct SimOptions {
  uint32_t blocks = 32;
  uint32_t blocks_per_chunk = 1;  // > 1: a device pool mapped by chunks
  FailureDetector::Options detector;
  CrashLoopGuard::Options guard;
  Duration register_timeout = std::chrono::seconds(1);
  Duration reconnect_timeout = milliseconds(300);
  // Deliberate faults, for tests that prove the checks catch them.
  PoolLedger::Mutation mutation = PoolLedger::Mutation::kNone;
  bool skip_barrier = false;     // hand blocks on once reaped, without the barrier
  bool release_at_once = false;  // hand blocks on at the fence, before the kill lands
};

class SimController {
 public:
  SimController(SimWorld& world, SimEpochStore& store, const SimOptions& options, bool restarted)
      : world_(world),
        store_(store),
        options_(options),
        ledger_(restarted ? PoolLedger::Recovering(options.blocks, store)
                          : PoolLedger(options.blocks, store)),
        pair_(NewPairMachine("pair", world.clock())),
        guard_(world.clock(), options.guard) {
    ledger_.SetMutationForTesting(options.mutation);
    (void)ledger_.SetBlocksPerChunk(options.blocks_per_chunk);
    if (!restarted) return;
    for (EngineId id : world_.Roster()) recovery_[id] = Recovery{Now() + options.reconnect_timeout};
  }

  // --- engine messages ---------------------------------------------------------------------
  Status OnRegister(EngineId id) {
    if (id != standby_ || !Is(id, EngineState::kLaunching)) {
      if (!recovery_.count(id) || standby_ != kNoEngine) return Reject(id, "unexpected register");
      recovery_.erase(id);
      standby_ = id;
      Track(id);
    }
    ModelOk(ledger_.AddStandby(id), "add standby");
    Step(engines_.at(id).machine, EngineEvent::kRegistered);
    engines_.at(id).detector.emplace(world_.clock(), options_.detector);
    Step(pair_, PairEvent::kStandbyReady);
    return OkStatus();
  }

  Status OnReconnect(EngineId id, const Claim& claim) {
    if (!recovery_.count(id)) return Reject(id, "unknown engine reconnected");
    if (claim.promoted) {
      if (primary_ != kNoEngine) return Reject(id, "a primary is already connected");
      Status status = ledger_.Readopt(id, claim.epoch, claim.extents);
      if (!status.ok()) return Reject(id, status.message());
      recovery_.erase(id);
      Track(id);
      Tracked& t = engines_.at(id);
      for (EngineEvent e :
           {EngineEvent::kRegistered, EngineEvent::kPromoteStarted, EngineEvent::kPromoteDone}) {
        Step(t.machine, e);
      }
      t.detector.emplace(world_.clock(), options_.detector);
      primary_ = id;
      Step(pair_, PairEvent::kPromoteDone);
      return OkStatus();
    }
    if (standby_ != kNoEngine) return Reject(id, "a standby is already connected");
    return OnRegister(id);
  }

  Status OnMessage(EngineId id, const SimMessage& m) {
    switch (m.kind) {
      case MsgKind::kHeartbeat: {
        Status status = ledger_.CheckMessage(id, m.epoch);
        if (status.ok() && engines_.count(id) && engines_.at(id).detector) {
          engines_.at(id).detector->OnHeartbeat();
        }
        return status;
      }
      case MsgKind::kGrant: {
        auto extents = ledger_.Grant(id, m.blocks, m.epoch);
        if (!extents.ok()) return extents.status();
        world_.DeliverGrant(id, *extents, ledger_.engine(id)->epoch);
        return OkStatus();
      }
      case MsgKind::kReturn:
        return ledger_.Return(id, m.extent, m.epoch);
      case MsgKind::kError: {
        Status status = ledger_.CheckMessage(id, m.epoch);
        if (status.ok() && engines_.count(id) && !fencing_.count(id)) Fail(id, Cause::kError);
        return status;
      }
    }
    return InvalidArgument("unknown message");
  }

  // `batonctl promote`: a planned switch-over; refused with the pair's reason if not ready.
  Status OnGracefulPromote() {
    Result<PairState> state = pair_.Apply(PairEvent::kGracefulPromoteRequested);
    if (!state.ok()) return state.status();
    Step(engines_.at(primary_).machine, EngineEvent::kDrain);
    return OkStatus();
  }

  // The io_context's timers and pidfd readiness, all at once.
  void Poll() {
    CheckExits();
    PollDetectors();
    CheckDeadlines();
    ProgressSwitchover();
    ProgressFences();
    ProgressRecovery();
    MaybePromote();
    MaybeLaunch();
  }

  // --- observation -------------------------------------------------------------------------
  const PoolLedger& ledger() const { return ledger_; }
  PairState pair_state() const { return pair_.state(); }
  const CrashLoopGuard& guard() const { return guard_; }
  const std::string& model_error() const { return model_error_; }
  EngineId primary() const { return primary_; }
  EngineId standby() const { return standby_; }
  bool idle() const { return fencing_.empty() && recovery_.empty(); }

  // The pair state must agree with the engines the controller tracks.
  Status CheckConsistency() const {
    if (!model_error_.empty()) return Internal(model_error_);
    const PairState s = pair_.state();
    if (PairServes(s) != (primary_ != kNoEngine)) {
      return Internal(std::string("model: pair ") + ToString(s) +
                      (primary_ ? " with a primary" : " without a primary"));
    }
    if (s == PairState::kFailingOver) return Internal("model: failover left unfinished");
    if (s == PairState::kReady && !Is(standby_, EngineState::kStandby)) {
      return Internal("model: pair ready without a registered standby");
    }
    return OkStatus();
  }

 private:
  enum class Cause { kDied, kHung, kError, kTimeout, kPlanned };
  struct Tracked {
    EngineMachine machine;
    std::optional<FailureDetector> detector;
    TimePoint deadline;
    bool reaped = false;
  };
  struct Recovery {
    TimePoint deadline;
    bool killed = false;
  };

  TimePoint Now() const { return world_.now(); }
  bool Is(EngineId id, EngineState s) const {
    auto it = engines_.find(id);
    return it != engines_.end() && it->second.machine.state() == s;
  }
  void Track(EngineId id) {
    engines_.emplace(id, Tracked{NewEngineMachine(id, world_.clock()), std::nullopt,
                                 Now() + options_.register_timeout});
  }
  template <typename M, typename E>
  void Step(M& machine, E event) {
    Result<decltype(machine.state())> r = machine.Apply(event);
    if (!r.ok() && model_error_.empty()) model_error_ = "model: " + r.status().message();
  }
  void ModelOk(const Status& status, const char* what) {
    if (!status.ok() && model_error_.empty()) {
      model_error_ = std::string("model: ") + what + ": " + status.message();
    }
  }
  Status Reject(EngineId id, const std::string& why) {
    world_.Kill(id, false);
    if (recovery_.count(id)) recovery_.at(id).killed = true;
    return FailedPrecondition(why);
  }

  void Fail(EngineId id, Cause cause) {
    Tracked& t = engines_.at(id);
    Step(t.machine, EngineEventFor(cause));
    t.detector.reset();
    if (!world_.Exited(id)) world_.Kill(id, cause == Cause::kHung);
    fencing_.insert(id);
    if (cause != Cause::kPlanned) (void)guard_.RecordFailure();
    if (id == primary_) {
      FailPrimary(id, cause);
    } else if (id == standby_) {
      standby_ = kNoEngine;
      Step(pair_, PairEvent::kStandbyDied);
      if (ledger_.engine(id) != nullptr) ModelOk(ledger_.FenceStandby(id), "fence standby");
    }
  }
  static EngineEvent EngineEventFor(Cause cause) {
    switch (cause) {
      case Cause::kDied:
        return EngineEvent::kDied;
      case Cause::kHung:
      case Cause::kTimeout:
        return EngineEvent::kHungConfirmed;
      case Cause::kError:
        return EngineEvent::kErrorReported;
      case Cause::kPlanned:
        return EngineEvent::kDrained;
    }
    return EngineEvent::kDied;
  }
  void FailPrimary(EngineId id, Cause cause) {
    primary_ = kNoEngine;
    switch (cause) {
      case Cause::kPlanned:
        Step(pair_, PairEvent::kDrained);
        break;
      case Cause::kHung:
        Step(pair_, PairEvent::kPrimaryHung);
        break;
      case Cause::kError:
        Step(pair_, PairEvent::kErrorReported);
        break;
      default:
        Step(pair_, PairEvent::kPrimaryDied);
        break;
    }
    Result<uint64_t> epoch = store_.Advance();
    ModelOk(ledger_.Fence(id, *epoch), "fence");
    if (Is(standby_, EngineState::kStandby)) Promote(standby_, *epoch);
  }
  void Promote(EngineId id, uint64_t epoch) {
    Tracked& t = engines_.at(id);
    Step(t.machine, EngineEvent::kPromoteStarted);
    ModelOk(ledger_.Promote(id, epoch), "promote");
    world_.DeliverPromote(id, epoch);
    Step(t.machine, EngineEvent::kPromoteDone);
    primary_ = id;
    standby_ = kNoEngine;
    Step(pair_, PairEvent::kPromoteDone);
  }

  void CheckExits() {
    std::vector<EngineId> died;
    for (const auto& [id, t] : engines_) {
      if (!fencing_.count(id) && world_.Exited(id)) died.push_back(id);
    }
    for (EngineId id : died) Fail(id, Cause::kDied);
  }
  void PollDetectors() {
    std::vector<EngineId> hung;
    for (auto& [id, t] : engines_) {
      if (!t.detector) continue;
      switch (t.detector->Poll()) {
        case FailureDetector::Action::kSendProbe:
          if (world_.Probe(id)) t.detector->OnHealthReply();
          break;
        case FailureDetector::Action::kDeclareHung:
          hung.push_back(id);
          break;
        case FailureDetector::Action::kNone:
          break;
      }
    }
    for (EngineId id : hung) Fail(id, Cause::kHung);
  }
  void CheckDeadlines() {
    if (Is(standby_, EngineState::kLaunching) && Now() >= engines_.at(standby_).deadline) {
      Fail(standby_, Cause::kTimeout);
    }
  }
  void ProgressSwitchover() {
    if (Is(primary_, EngineState::kDraining)) {
      if (Is(standby_, EngineState::kStandby)) {
        Fail(primary_, Cause::kPlanned);
      } else {
        Step(engines_.at(primary_).machine, EngineEvent::kDrainCancelled);
      }
    }
  }
  void ProgressFences() {
    for (EngineId id : std::vector<EngineId>(fencing_.begin(), fencing_.end())) {
      Tracked& t = engines_.at(id);
      if (!options_.release_at_once) {
        if (!world_.Exited(id)) continue;
        if (!t.reaped) t.reaped = world_.Reap(id);
        if (!options_.skip_barrier && !world_.BarrierPassed(id)) continue;
      }
      const LedgerEngine* e = ledger_.engine(id);
      if (e != nullptr && e->role == LedgerRole::kFenced) Release(id, e->epoch != 0);
      Step(t.machine, EngineEvent::kFenceDone);
      Step(pair_, PairEvent::kFenceDone);
      world_.ForgetRoster(id);
      fencing_.erase(id);
      engines_.erase(id);
    }
  }
  // Quarantined blocks go to the current primary (mapped into its range) or back to the pool.
  void Release(EngineId id, bool had_leases) {
    const bool hand_on = had_leases && Is(primary_, EngineState::kPrimary);
    auto moved = ledger_.ReleaseAfterBarrier(id, hand_on ? primary_ : kNoEngine);
    if (!moved.ok()) ModelOk(moved.status(), "release");
    if (hand_on && moved.ok() && !moved->empty()) {
      world_.DeliverGrant(primary_, *moved, ledger_.engine(primary_)->epoch);
    }
  }
  void ProgressRecovery() {
    if (!ledger_.recovering()) return;
    for (auto it = recovery_.begin(); it != recovery_.end();) {
      const EngineId id = it->first;
      if (world_.Exited(id)) {
        world_.Reap(id);
        if (world_.BarrierPassed(id)) {
          world_.ForgetRoster(id);
          it = recovery_.erase(it);
          continue;
        }
      } else if (!it->second.killed && Now() >= it->second.deadline) {
        world_.Kill(id, false);  // silent since the restart: treat as stale
        it->second.killed = true;
      }
      ++it;
    }
    if (recovery_.empty()) ModelOk(ledger_.EndRecovery(), "end recovery");
  }
  void MaybePromote() {
    if (primary_ != kNoEngine || !Is(standby_, EngineState::kStandby)) return;
    if (!pair_.Allows(PairEvent::kPromoteDone)) return;
    Result<uint64_t> epoch = store_.Advance();
    Promote(standby_, *epoch);
  }
  void MaybeLaunch() {
    const bool backoff =
        pair_.state() == PairState::kDegradedBackoff || pair_.state() == PairState::kDownBackoff;
    if (backoff && !guard_.InBackoff()) Step(pair_, PairEvent::kBackoffElapsed);
    // After a restart, previous-incarnation engines are resolved before new ones start.
    if (standby_ != kNoEngine || ledger_.recovering()) return;
    if (guard_.InBackoff()) {
      if (!backoff) Step(pair_, PairEvent::kCrashLoopTripped);
      return;
    }
    if (!guard_.TryStartRestart()) return;
    standby_ = world_.Launch();
    Track(standby_);
  }

  SimWorld& world_;
  SimEpochStore& store_;
  SimOptions options_;
  PoolLedger ledger_;
  PairMachine pair_;
  CrashLoopGuard guard_;
  std::map<EngineId, Tracked> engines_;
  std::set<EngineId> fencing_;
  std::map<EngineId, Recovery> recovery_;
  EngineId primary_ = kNoEngine;
  EngineId standby_ = kNoEngine;
  std::string model_error_;
};

}  // namespace baton::sim
