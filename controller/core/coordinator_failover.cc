// FailoverPart: failures and fences (coordinator_failover.h).
#include <algorithm>

#include "base/bug.h"
#include "base/failpoint.h"
#include "base/log.h"
#include "controller/core/coordinator_parts.h"

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
    case FailCause::kUnaccounted:
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
    case FailCause::kUnaccounted:
      return "unaccounted for";
  }
  return "unknown";
}

std::vector<proto::BlockRange> ToRanges(const std::vector<Extent>& extents) {
  std::vector<proto::BlockRange> out;
  for (const Extent& e : extents) out.push_back(proto::BlockRange{e.first, e.count});
  return out;
}

std::vector<Extent> ToExtents(const std::vector<proto::BlockRange>& ranges) {
  std::vector<Extent> out;
  for (const proto::BlockRange& r : ranges) out.push_back(Extent{r.first, r.count});
  return out;
}

uint32_t BlocksIn(const std::vector<Extent>& extents) {
  uint32_t n = 0;
  for (const Extent& e : extents) n += e.count;
  return n;
}

FailoverPart::FailoverPart(CoordinatorState& s, const CoordinatorParts& p) : s_(s), p_(p) {}

// --- failures ---------------------------------------------------------------------------------

void FailoverPart::OnExited(EngineId id, const std::string& how) {
  EngineRecord* e = s_.Find(id);
  if (e == nullptr) return;
  if (s_.stopping) {
    BATON_LOG(INFO, kLog) << "engine " << id << " (pid " << e->pid << ") "
                          << (e->live() ? "exited after Stop" : "reaped") << ": " << how;
    s_.RecordExit(*e, e->fail_cause.has_value() ? ToString(*e->fail_cause) : "stopped", how);
    s_.Forget(id);
    s_.effects.Release(id);
    if (s_.engines.empty()) p_.engines->SaveRoster();  // a clean stop leaves nothing to re-adopt
    return;
  }
  // Not fenced yet (its exit came before its connection's end): fenced now, as for a lost
  // connection; fenced already: nothing more.
  Fence(id, FailCause::kDied, how);
  BATON_LOG(INFO, kLog) << "engine " << id << " (pid " << e->pid << ") reaped: " << how;
  // A death seen by its exit carries the exit as its reason: said once.
  const std::string cause = ToString(*e->fail_cause);
  s_.RecordExit(*e, e->fail_reason == how ? cause : cause + ": " + e->fail_reason, how);
  if (p_.recovery->active() && e->adopted && s_.ledger->engine(id) == nullptr) {
    p_.recovery->NoteGone(*e, "exited");  // what it held is in the previous controller's quarantine
  } else {
    OnReaped(*e);
  }
  if (p_.recovery->active()) p_.recovery->TickRecovery();
  MaybePromote();
  p_.upgrades->GiveFreeBlocksToPrimary();
  p_.engines->MaybeLaunch();
  p_.engines->PublishRoutes();
  s_.CheckInvariants();
}

void FailoverPart::Fence(EngineId id, FailCause cause, const std::string& detail) {
  EngineRecord* e = s_.Find(id);
  if (e == nullptr || !e->live()) return;
  const TimePoint detected_at = s_.clock.Now();
  e->fail_cause = cause;
  e->fail_reason = detail;
  const std::string state = ToString(e->state());
  const EngineEvent event = EventFor(cause);
  s_.Step(e->machine, e->machine.Allows(event) ? event : EngineEvent::kFenceStarted);
  e->detector.reset();
  e->deadline.reset();
  // Killing is the only revocation of a mapping: every fenced engine is killed and reaped,
  // with every process of its group and of its cgroup.
  const bool alive = s_.effects.Kill(id);
  const TimePoint killed_at = s_.clock.Now();
  e->connected = false;
  // A planned retirement (a drained primary, a stop) is no fault: said at INFO.
  const bool planned = cause == FailCause::kPlanned || cause == FailCause::kShutdown;
  BATON_LOG_AT(planned ? LogLevel::kInfo : LogLevel::kWarn, kLog)
      << "engine " << id << " (pid " << e->pid << ", " << state << ") fenced: " << ToString(cause)
      << ": " << detail << (alive ? "; SIGKILL sent" : "; already exited");
  // While the controller stops, the pool goes with it: killing is enough, no epoch is spent.
  if (s_.stopping) return;
  // A canary that fails is the upgrade's failure, judged and rolled back by it: it says
  // nothing of the active command, whose standby the guard would hold back.
  const bool counts = cause != FailCause::kPlanned && cause != FailCause::kShutdown &&
                      cause != FailCause::kUnaccounted && !p_.upgrades->IsCanary(id);
  if (counts) (void)s_.guard.RecordFailure();  // a trip is logged by the guard
  if (id == s_.primary) {
    FailPrimary(*e, cause, detected_at, alive ? std::optional<TimePoint>(killed_at) : std::nullopt);
  } else {
    if (id == s_.promoting) {
      s_.promoting = kNoEngine;
      if (PromotionRecord* r = s_.timelines.current()) r->outcome = "the promoted engine failed";
    }
    if (own_.failover.has_value() && own_.failover->successor == id)
      own_.failover->successor = kNoEngine;
    FenceInLedger(*e);
    const bool switching_over = s_.pair.state() == PairState::kSwitchingOver;
    if (!p_.recovery->IsLostPrimary(id)) s_.StepPairIfAllowed(PairEvent::kStandbyDied);
    if (switching_over) p_.commands->CallOffSwitchover(*e);
    if (p_.upgrades->IsCanary(id)) p_.upgrades->OnCanaryGone(*e);
  }
  p_.engines->SaveRoster();
  p_.engines->PublishRoutes();
  s_.CheckInvariants();
}

void FailoverPart::FailPrimary(EngineRecord& e, FailCause cause, TimePoint detected_at,
                               std::optional<TimePoint> killed_at) {
  s_.primary = kNoEngine;
  p_.upgrades->OnPrimaryFailed(e);
  if (cause != FailCause::kPlanned) ++s_.failovers;  // a drain or switch-over retires, planned
  const PairState before = s_.pair.state();
  PromotionRecord* r = s_.timelines.current();
  if (r == nullptr ||
      (r->kind != PromotionKind::kSwitchover && r->kind != PromotionKind::kUpgrade)) {
    const PromotionKind kind =
        before == PairState::kDraining ? PromotionKind::kDrain : PromotionKind::kFailover;
    r = &s_.timelines.Open(kind, std::string(ToString(cause)) + ": " + e.fail_reason);
  }
  r->old_engine = e.id;
  r->old_pid = e.pid;
  r->detected = detected_at;
  r->killed = killed_at;
  if (s_.drill.has_value() && s_.drill->engine == e.id) {
    r->injected = s_.drill->at;
    r->cause = std::string("drill ") + ToString(s_.drill->kind) + ": " + r->cause;
    s_.drill.reset();
  }
  if (cause == FailCause::kHung) r->last_heartbeat = e.last_heartbeat;
  s_.StepPair(PrimaryEventFor(cause, before));
  Result<uint64_t> epoch = FenceHolder(e.id);
  if (epoch.ok()) {
    r->epoch = r->fence_epoch = *epoch;  // a canary that takes over says its own epoch
    r->epoch_durable = s_.clock.Now();
    BATON_FAILPOINT("after_fence");  // killed, fenced at a durable epoch, nothing handed on
  }
  // A serving canary needs no new epoch (it has its own); the old primary's fence is retried
  // at its exit when the journal failed here.
  if (p_.upgrades->CanaryTakesOver(e)) return;
  if (!epoch.ok()) {
    r->outcome = "down: " + epoch.status().message();
    return;
  }
  EngineRecord* successor = s_.pair.state() == PairState::kStopped ? nullptr : Successor();
  own_.failover = PendingFailover{e.id, *epoch, successor != nullptr ? successor->id : kNoEngine};
  r->new_engine = own_.failover->successor;
  if (const LedgerEngine* le = s_.ledger->engine(e.id); le != nullptr) {
    r->quarantined_blocks = le->blocks;
  }
  if (successor == nullptr && s_.pair.state() != PairState::kStopped) {
    if (const EngineRecord* silent = s_.Standby(); silent != nullptr) {
      BATON_LOG(WARN, kLog) << "engine " << silent->id << " (the standby) is silent too: it is "
                            << "promoted once it answers, fenced if it does not";
    } else {
      BATON_LOG(WARN, kLog) << "no standby is ready: the pair is down until one registers";
    }
  }
  // A drain ends here: nothing is promoted, and the resume's promotion is a timeline of its
  // own, not this one's (whose phases would count the time the pair stood stopped).
  if (s_.pair.state() == PairState::kStopped) {
    s_.timelines.Close("stopped: the pair was drained (batonctl resume starts it again)");
  }
  if (successor != nullptr) PromoteBeforeBarrier(*successor);
}

void FailoverPart::FenceInLedger(EngineRecord& e) {
  const LedgerEngine* le = s_.ledger->engine(e.id);
  if (le == nullptr) return;
  Status status = OkStatus();
  if (le->role == LedgerRole::kStandby) {
    status = s_.ledger->FenceStandby(e.id);
  } else if (le->role == LedgerRole::kHolder) {
    status = FenceHolder(e.id).status();
  }
  if (!status.ok())
    BATON_LOG(ERROR, kLog) << "fencing engine " << e.id << ": " << status.ToString();
}

Result<uint64_t> FailoverPart::FenceHolder(EngineId id) {
  BATON_ASSIGN_OR_RETURN(const uint64_t epoch, s_.AdvanceEpoch());
  if (Status fenced = s_.ledger->Fence(id, epoch); !fenced.ok()) {
    BATON_BUG("ledger") << "fencing engine " << id << ": " << fenced.ToString();
  }
  return epoch;
}

// The engine's process is gone: its blocks move on once the barrier has passed.
void FailoverPart::OnReaped(EngineRecord& e) {
  const TimePoint now = s_.clock.Now();
  const EngineId id = e.id;
  const LedgerEngine* le = s_.ledger->engine(id);
  // A holder whose fence could not get a durable epoch earlier is fenced now.
  if (le != nullptr && le->role == LedgerRole::kHolder) FenceInLedger(e);
  le = s_.ledger->engine(id);
  if (le != nullptr && le->role == LedgerRole::kHolder) {
    own_.unfenced_reaped[id] = e.pid;
    BATON_LOG(ERROR, kLog) << "engine " << id << " is reaped but has no durable epoch to be "
                           << "fenced at: its " << le->blocks
                           << " blocks wait until the epoch journal can be written";
  }
  const bool fenced = le != nullptr && le->role == LedgerRole::kFenced;
  std::optional<PendingFailover> failover;
  if (own_.failover.has_value() && own_.failover->old == id) {
    failover = *own_.failover;
    own_.failover.reset();
    if (PromotionRecord* r = s_.timelines.Fenced(id, failover->epoch)) r->reaped = now;
  }
  // Only blocks wait for the barrier: an engine that held none (a standby) hands on nothing.
  const bool held_blocks = fenced && le->blocks > 0;
  BarrierWait wait{.old = id,
                   .pid = e.pid,
                   .failover = failover,
                   .deadline = now + s_.config.gpu_release_timeout};
  if (held_blocks || failover.has_value()) {
    PassBarrierOrWait(std::move(wait));
  } else if (fenced) {
    HandOverBlocks(id, std::nullopt);
  }
  s_.Step(e.machine, EngineEvent::kFenceDone);
  s_.StepPairIfAllowed(PairEvent::kFenceDone);
  s_.Forget(id);
  ReleaseIfDone(id);
  p_.engines->SaveRoster();
}

void FailoverPart::OnDrained(EngineRecord& e, const proto::Drained& msg) {
  if (!p_.engines->CheckEpoch(e, msg.epoch, "Drained")) return;
  if (e.called_off_drains > 0) {  // Drains are answered in order, each exactly once
    --e.called_off_drains;
    BATON_LOG(INFO, kLog) << "engine " << e.id << " answered its called-off drain ("
                          << msg.unfinished << " requests were unfinished)";
    return;
  }
  if (!e.is(EngineState::kDraining)) {
    return p_.engines->RefuseEngine(e, FailedPrecondition("Drained without a Drain request"));
  }
  Fence(e.id, FailCause::kPlanned, std::to_string(msg.unfinished) + " requests unfinished");
}

// --- epochs -----------------------------------------------------------------------------------

// Keeps a batch of epochs durable ahead of the next promotion, at a moment when no failover
// is in flight; a journal that cannot be written is logged once until it can again.
void FailoverPart::ReplenishEpochs() {
  if (own_.failover.has_value() || s_.promoting != kNoEngine || !own_.barrier_waits.empty()) return;
  if (s_.clock.Now() < own_.next_replenish) return;
  Status s = s_.epochs.Replenish();
  s_.NoteJournalState();
  if (!s.ok()) {
    own_.next_replenish = s_.clock.Now() + std::chrono::seconds(5);  // each try spends a batch
    if (!own_.replenish_failing) {
      BATON_LOG(ERROR, kLog) << "cannot reserve epochs ahead (promotions will write the journal "
                                "themselves): "
                             << s.ToString();
    }
    own_.replenish_failing = true;
    return;
  }
  own_.replenish_failing = false;
}

}  // namespace baton
