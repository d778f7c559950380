// Controller: failures, fences, promotions, operator commands, routes.
#include <signal.h>

#include "base/log.h"
#include "controller/controller.h"

namespace baton {
namespace {

constexpr const char* kLog = "controller";

EngineEvent EventFor(FailCause cause) {
  switch (cause) {
    case FailCause::kDied:
    case FailCause::kEof:
      return EngineEvent::kDied;
    case FailCause::kHung:
    case FailCause::kTimeout:
      return EngineEvent::kHungConfirmed;
    case FailCause::kError:
      return EngineEvent::kErrorReported;
    case FailCause::kPlanned:
      return EngineEvent::kDrained;
    case FailCause::kStale:
    case FailCause::kMisbehaved:
    case FailCause::kShutdown:
      return EngineEvent::kFenceStarted;
  }
  return EngineEvent::kFenceStarted;
}

PairEvent PrimaryEventFor(FailCause cause, PairState state) {
  switch (cause) {
    case FailCause::kPlanned:
      return state == PairState::kSwitchingOver || state == PairState::kDraining
                 ? PairEvent::kDrained
                 : PairEvent::kPrimaryDied;
    case FailCause::kHung:
    case FailCause::kTimeout:
      return PairEvent::kPrimaryHung;
    case FailCause::kError:
      return PairEvent::kErrorReported;
    default:
      return PairEvent::kPrimaryDied;
  }
}

uint32_t BlocksIn(const std::vector<Extent>& extents) {
  uint32_t n = 0;
  for (const Extent& e : extents) n += e.count;
  return n;
}

}  // namespace

const char* ToString(FailCause cause) {
  switch (cause) {
    case FailCause::kDied:
      return "died";
    case FailCause::kEof:
      return "connection lost";
    case FailCause::kHung:
      return "hung";
    case FailCause::kError:
      return "error reported";
    case FailCause::kStale:
      return "stale epoch";
    case FailCause::kTimeout:
      return "timed out";
    case FailCause::kMisbehaved:
      return "protocol violation";
    case FailCause::kPlanned:
      return "drained";
    case FailCause::kShutdown:
      return "stopped";
  }
  return "unknown";
}

// --- failures -----------------------------------------------------------------------------------

void Controller::Fail(EngineId id, FailCause cause, const std::string& detail) {
  EngineRecord* e = Find(id);
  if (e == nullptr || e->failed.has_value()) return;
  const TimePoint detected_at = clock_.Now();
  e->failed = cause;
  e->fail_reason = detail;
  const std::string state = ToString(e->machine.state());
  const EngineEvent event = EventFor(cause);
  (void)e->machine.Apply(e->machine.Allows(event) ? event : EngineEvent::kFenceStarted);
  e->detector.reset();
  e->deadline.reset();
  e->serving = false;
  // Killing is the only revocation of a mapping: every fenced engine is killed and reaped,
  // with every process of its group (its workers; the engine itself under a wrapper script)
  // and of its cgroup (any process it started, even one that left the group).
  if (nvml_ != nullptr) e->group_pids = EnginePids(*e);
  Result<std::optional<ExitInfo>> exited = e->process.TryReap();
  const bool alive = exited.ok() && !exited->has_value();
  const TimePoint killed_at = clock_.Now();
  if (alive) {
    if (Status killed = e->process.Signal(SIGKILL); !killed.ok()) {
      BATON_LOG(ERROR, kLog) << killed.ToString();
    }
  }
  if (Status killed = e->process.SignalGroup(SIGKILL); !killed.ok()) {
    BATON_LOG(ERROR, kLog) << killed.ToString();
  }
  if (e->cgroup != nullptr) {
    if (Status killed = e->cgroup->Kill(); !killed.ok()) {
      BATON_LOG(ERROR, kLog) << killed.ToString();
    }
  }
  if (e->channel != nullptr) e->channel->Close();
  e->channel.reset();
  BATON_LOG(WARN, kLog) << "engine " << id << " (pid " << e->process.pid() << ", " << state
                        << ") fenced: " << ToString(cause) << ": " << detail
                        << (alive ? "; SIGKILL sent" : "; already exited");
  // While the controller stops, the pool goes with it: killing is enough, no epoch is spent.
  if (stopping_) return;
  if (cause != FailCause::kPlanned && cause != FailCause::kShutdown && guard_.RecordFailure()) {
    BATON_LOG(WARN, kLog) << "crash-loop guard tripped: " << guard_.recent_failures()
                          << " failures within the window";
  }
  if (id == primary_) {
    FailPrimary(*e, cause, detected_at, alive ? std::optional<TimePoint>(killed_at) : std::nullopt);
  } else {
    if (id == promoting_) {
      promoting_ = kNoEngine;
      if (PromotionRecord* r = timelines_.current()) r->outcome = "the promoted engine failed";
    }
    if (failover_.has_value() && failover_->successor == id) failover_->successor = kNoEngine;
    FenceInLedger(*e);
    const bool switching_over = pair_.state() == PairState::kSwitchingOver;
    if (pair_.Allows(PairEvent::kStandbyDied)) ApplyPair(PairEvent::kStandbyDied);
    if (switching_over) CallOffSwitchover(*e);
    if (IsCanary(id)) OnCanaryGone(*e);
  }
  PublishRoutes();
  CheckInvariants();
}

void Controller::FailPrimary(EngineRecord& e, FailCause cause, TimePoint detected_at,
                             std::optional<TimePoint> killed_at) {
  primary_ = kNoEngine;
  ++failovers_;
  const PairState before = pair_.state();
  PromotionRecord* r = timelines_.current();
  if (r == nullptr || (r->kind != "switchover" && r->kind != "upgrade")) {
    const char* kind = before == PairState::kDraining ? "drain" : "failover";
    r = &timelines_.Open(kind, std::string(ToString(cause)) + ": " + e.fail_reason);
  }
  r->old_engine = e.id;
  r->old_pid = e.process.pid();
  r->detected = detected_at;
  r->killed = killed_at;
  if (drill_.has_value() && drill_->engine == e.id) {
    r->injected = drill_->at;
    r->cause = "drill " + drill_->kind + ": " + r->cause;
    drill_.reset();
  }
  if (cause == FailCause::kHung) r->last_heartbeat = e.last_heartbeat;
  ApplyPair(PrimaryEventFor(cause, before));
  Result<uint64_t> epoch = AdvanceEpoch();
  if (epoch.ok()) {
    if (Status fenced = ledger_->Fence(e.id, *epoch); !fenced.ok()) {
      BATON_LOG(ERROR, kLog) << "fencing engine " << e.id << ": " << fenced.ToString();
    }
    r->epoch = *epoch;
    r->epoch_durable = clock_.Now();
  }
  // A serving canary needs no new epoch (it has its own); the old primary's fence is retried
  // at its reap when the journal failed here.
  if (CanaryTakesOver(e)) return;
  if (!epoch.ok()) {
    r->outcome = "down: " + epoch.status().message();
    return;
  }
  EngineRecord* successor = pair_.state() == PairState::kStopped ? nullptr : Standby();
  failover_ = PendingFailover{e.id, *epoch, successor != nullptr ? successor->id : kNoEngine};
  r->new_engine = failover_->successor;
  if (successor == nullptr && pair_.state() != PairState::kStopped) {
    BATON_LOG(WARN, kLog) << "no standby is ready: the pair is down until one registers";
  }
}

void Controller::FenceInLedger(EngineRecord& e) {
  const LedgerEngine* le = ledger_->engine(e.id);
  if (le == nullptr) return;
  Status status = OkStatus();
  if (le->role == LedgerRole::kStandby) {
    status = ledger_->FenceStandby(e.id);
  } else if (le->role == LedgerRole::kHolder) {
    Result<uint64_t> epoch = AdvanceEpoch();
    status = epoch.ok() ? ledger_->Fence(e.id, *epoch) : epoch.status();
  }
  if (!status.ok())
    BATON_LOG(ERROR, kLog) << "fencing engine " << e.id << ": " << status.ToString();
}

void Controller::OnProcessExit(EngineId id) {
  EngineRecord* e = Find(id);
  if (e == nullptr) return;
  Result<std::optional<ExitInfo>> exited = e->process.TryReap();
  if (!exited.ok()) {
    BATON_LOG(ERROR, kLog) << "reaping engine " << id << ": " << exited.status().ToString();
    return;
  }
  if (!exited->has_value()) return WatchPid(id);  // not yet: wait again
  if (stopping_) return OnStoppedExit(*e, **exited, /*killed=*/false);
  const std::string how = (*exited)->ToString();
  if (!e->failed.has_value()) Fail(id, FailCause::kDied, how);
  BATON_LOG(INFO, kLog) << "engine " << id << " (pid " << e->process.pid() << ") reaped: " << how;
  FinishFence(*e);
  MaybePromote();
  GiveFreeBlocksToPrimary();
  MaybeLaunch();
  PublishRoutes();
  CheckInvariants();
  ArmTick();
}

// The engine is reaped: on the host backend that is the sync barrier. Its blocks move on.
void Controller::FinishFence(EngineRecord& e) {
  const TimePoint now = clock_.Now();
  const EngineId id = e.id;
  exits_.push_back(EngineExit{now, id, e.process.pid(), e.launch_role,
                              std::string(ToString(*e.failed)) + ": " + e.fail_reason,
                              e.process.exit_info()->ToString()});
  if (exits_.size() > 20) exits_.pop_front();
  const LedgerEngine* le = ledger_->engine(id);
  // A holder whose fence could not get a durable epoch earlier is fenced now.
  if (le != nullptr && le->role == LedgerRole::kHolder) FenceInLedger(e);
  le = ledger_->engine(id);
  if (le != nullptr && le->role == LedgerRole::kHolder) {
    unfenced_reaped_[id] = {.pid = e.process.pid(), .cgroup = e.cgroup};
    BATON_LOG(ERROR, kLog) << "engine " << id << " is reaped but has no durable epoch to be "
                           << "fenced at: its " << le->blocks
                           << " blocks wait until the epoch journal can be written";
  }
  const bool fenced = le != nullptr && le->role == LedgerRole::kFenced;
  std::optional<PendingFailover> failover;
  if (failover_.has_value() && failover_->old == id) {
    failover = *failover_;
    failover_.reset();
    if (PromotionRecord* r = timelines_.current()) r->reaped = now;
  }
  // Only blocks wait for the driver: an engine that held none (a standby) has nothing to hand on.
  const bool held_blocks = fenced && le->blocks > 0;
  BarrierWait wait{.old = id,
                   .pid = e.process.pid(),
                   .group_pids = e.group_pids,
                   .cgroup = e.cgroup,
                   .failover = failover,
                   .deadline = now + config_.gpu_release_timeout};
  if (held_blocks || failover.has_value()) {
    PassBarrierOrWait(std::move(wait));
  } else if (fenced) {
    HandOverBlocks(id, std::nullopt);
  }
  (void)e.machine.Apply(EngineEvent::kFenceDone);
  if (pair_.Allows(PairEvent::kFenceDone)) ApplyPair(PairEvent::kFenceDone);
  engines_.erase(id);
}

// --- promotion ----------------------------------------------------------------------------------

// Blocks of a failed holder not yet past the barrier (a promoted engine that died before its
// PromoteAck, or a primary whose fence found no durable epoch): a promotion now would start
// without them, and the reap would free them rather than hand them over.
bool Controller::BlocksAwaitBarrier() const {
  if (ledger_->Snapshot().quarantined_blocks > 0 || !unfenced_reaped_.empty()) return true;
  for (const auto& [id, e] : engines_) {
    const LedgerEngine* le = ledger_->engine(id);
    if (e->failed.has_value() && le != nullptr && le->role == LedgerRole::kHolder) return true;
  }
  return false;
}

void Controller::MaybePromote() {
  if (stopping_ || primary_ != kNoEngine || promoting_ != kNoEngine || failover_.has_value() ||
      !barrier_waits_.empty() || BlocksAwaitBarrier()) {
    return;
  }
  if (!pair_.Allows(PairEvent::kPromoteDone)) return;
  EngineRecord* e = Standby();
  if (e == nullptr || clock_.Now() < next_promote_epoch_) return;
  Result<uint64_t> epoch = AdvanceEpoch();
  if (!epoch.ok()) {
    // Each failed try is a journal write and a log line: once a second, not on every tick.
    next_promote_epoch_ = clock_.Now() + std::chrono::seconds(1);
    return;
  }
  if (Status promoted = ledger_->Promote(e->id, *epoch); !promoted.ok()) {
    BATON_LOG(ERROR, kLog) << "promoting engine " << e->id << ": " << promoted.ToString();
    return;
  }
  const uint32_t free = ledger_->GrantableTo(e->id);
  const uint32_t want =
      config_.initial_grant_blocks == 0 ? free : std::min(free, config_.initial_grant_blocks);
  std::vector<Extent> extents;
  if (want > 0) {
    Result<std::vector<Extent>> granted = ledger_->Grant(e->id, want, *epoch);
    if (granted.ok()) extents = std::move(granted).value();
  }
  PromotionRecord* r = timelines_.current();
  if (r == nullptr) r = &timelines_.Open("promotion", "no primary");
  r->epoch = *epoch;
  r->epoch_durable = clock_.Now();
  r->new_engine = e->id;
  SendPromote(*e, *epoch, extents);
}

void Controller::SendPromote(EngineRecord& e, uint64_t epoch, const std::vector<Extent>& extents) {
  (void)e.machine.Apply(EngineEvent::kPromoteStarted);
  promoting_ = e.id;
  e.deadline = clock_.Now() + config_.promote_timeout;
  if (PromotionRecord* r = timelines_.current()) {
    r->promote_sent = clock_.Now();
    r->new_engine = e.id;
  }
  BATON_LOG(INFO, kLog) << "promoting engine " << e.id << " at epoch " << epoch << " with "
                        << BlocksIn(extents) << " blocks in " << extents.size() << " extents";
  Status sent = e.channel->Send(proto::Promote{.epoch = epoch, .extents = ToRanges(extents)});
  if (!sent.ok()) Fail(e.id, FailCause::kEof, "sending Promote: " + sent.message());
  CheckInvariants();
}

void Controller::OnPromoteAck(EngineRecord& e, const proto::PromoteAck& msg) {
  if (!CheckEpoch(e, msg.epoch, "PromoteAck")) return;
  if (!e.is(EngineState::kPromoting) || msg.epoch == 0) {
    return RefuseEngine(
        e, FailedPrecondition(std::string("PromoteAck in state ") + ToString(e.machine.state())));
  }
  if (IsCanary(e.id) && upgrade_->phase == Upgrade::Phase::kPromoting) {
    return OnCanaryPromoted(e, msg.epoch);
  }
  (void)e.machine.Apply(EngineEvent::kPromoteDone);
  promoting_ = kNoEngine;
  primary_ = e.id;
  if (IsCanary(e.id)) {
    EndUpgrade("promoted", "the primary failed before the canary served; the failover promoted it");
  }
  e.serving = true;
  e.deadline.reset();
  ApplyPair(PairEvent::kPromoteDone);
  if (Standby() != nullptr && pair_.Allows(PairEvent::kStandbyReady)) {
    ApplyPair(PairEvent::kStandbyReady);
  }
  PromotionRecord* r = timelines_.current();
  if (r != nullptr) r->promote_acked = clock_.Now();
  BATON_LOG(INFO, kLog) << "engine " << e.id << " is the primary at epoch " << msg.epoch << " ("
                        << msg.blocks_mapped << " blocks mapped)";
  PublishRoutes();
  if (r != nullptr) {
    BATON_LOG(INFO, kLog) << TimelineLog::Summary(*r);
    timelines_.Close("serving");
    relaunch_not_before_ = clock_.Now() + config_.standby_relaunch_delay;
    if (config_.standby_relaunch_delay > Duration::zero() && LiveEngines() < 2) {
      BATON_LOG(INFO, kLog) << "the replacement standby starts in "
                            << MillisBetween(clock_.Now(), relaunch_not_before_)
                            << " ms (policy.standby_relaunch_delay_ms)";
    }
  }
  MaybeLaunch();
  ArmTick();
}

void Controller::OnDrained(EngineRecord& e, const proto::Drained& msg) {
  if (!CheckEpoch(e, msg.epoch, "Drained")) return;
  if (e.called_off_drains > 0) {  // Drains are answered in order, each exactly once
    --e.called_off_drains;
    BATON_LOG(INFO, kLog) << "engine " << e.id << " answered its called-off drain ("
                          << msg.unfinished << " requests were unfinished)";
    return;
  }
  if (!e.is(EngineState::kDraining)) {
    return RefuseEngine(e, FailedPrecondition("Drained without a Drain request"));
  }
  Fail(e.id, FailCause::kPlanned, std::to_string(msg.unfinished) + " requests unfinished");
}

}  // namespace baton
