// Coordinator: failures, fences, promotions.
#include <algorithm>

#include "base/failpoint.h"
#include "base/log.h"
#include "controller/core/coordinator.h"

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

// --- failures -----------------------------------------------------------------------------------

void Coordinator::Fail(EngineId id, FailCause cause, const std::string& detail) {
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
  BATON_LOG(WARN, kLog) << "engine " << id << " (pid " << e->pid << ", " << state
                        << ") fenced: " << ToString(cause) << ": " << detail
                        << (alive ? "; SIGKILL sent" : "; already exited");
  // While the controller stops, the pool goes with it: killing is enough, no epoch is spent.
  if (s_.stopping) return;
  const bool counts = cause != FailCause::kPlanned && cause != FailCause::kShutdown &&
                      cause != FailCause::kUnaccounted;
  if (counts && s_.guard.RecordFailure()) {
    BATON_LOG(WARN, kLog) << "crash-loop guard tripped: " << s_.guard.recent_failures()
                          << " failures within the window";
  }
  if (id == s_.primary) {
    FailPrimary(*e, cause, detected_at, alive ? std::optional<TimePoint>(killed_at) : std::nullopt);
  } else {
    if (id == s_.promoting) {
      s_.promoting = kNoEngine;
      if (PromotionRecord* r = s_.timelines.current()) r->outcome = "the promoted engine failed";
    }
    if (failover_.has_value() && failover_->successor == id) failover_->successor = kNoEngine;
    FenceInLedger(*e);
    const bool switching_over = s_.pair.state() == PairState::kSwitchingOver;
    s_.StepPairIfAllowed(PairEvent::kStandbyDied);
    if (switching_over) CallOffSwitchover(*e);
    if (IsCanary(id)) OnCanaryGone(*e);
  }
  SaveRoster();
  PublishRoutes();
  s_.CheckInvariants();
}

void Coordinator::FailPrimary(EngineRecord& e, FailCause cause, TimePoint detected_at,
                              std::optional<TimePoint> killed_at) {
  s_.primary = kNoEngine;
  ++s_.failovers;
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
    static constexpr const char* kDrills[] = {"kill", "hang", "error"};
    r->injected = s_.drill->at;
    r->cause = std::string("drill ") + kDrills[static_cast<int>(s_.drill->kind)] + ": " + r->cause;
    s_.drill.reset();
  }
  if (cause == FailCause::kHung) r->last_heartbeat = e.last_heartbeat;
  s_.StepPair(PrimaryEventFor(cause, before));
  Result<uint64_t> epoch = s_.AdvanceEpoch();
  if (epoch.ok()) {
    if (Status fenced = s_.ledger->Fence(e.id, *epoch); !fenced.ok()) {
      BATON_LOG(ERROR, kLog) << "fencing engine " << e.id << ": " << fenced.ToString();
    }
    r->epoch = *epoch;
    r->epoch_durable = s_.clock.Now();
    BATON_FAILPOINT("after_fence");  // killed, fenced at a durable epoch, nothing handed on
  }
  // A serving canary needs no new epoch (it has its own); the old primary's fence is retried
  // at its exit when the journal failed here.
  if (CanaryTakesOver(e)) return;
  if (!epoch.ok()) {
    r->outcome = "down: " + epoch.status().message();
    return;
  }
  EngineRecord* successor = s_.pair.state() == PairState::kStopped ? nullptr : s_.Standby();
  failover_ = PendingFailover{e.id, *epoch, successor != nullptr ? successor->id : kNoEngine};
  r->new_engine = failover_->successor;
  if (const LedgerEngine* le = s_.ledger->engine(e.id); le != nullptr) {
    r->quarantined_blocks = le->blocks;
  }
  if (successor == nullptr && s_.pair.state() != PairState::kStopped) {
    BATON_LOG(WARN, kLog) << "no standby is ready: the pair is down until one registers";
  }
  if (successor != nullptr) PromoteBeforeBarrier(*successor);
}

void Coordinator::FenceInLedger(EngineRecord& e) {
  const LedgerEngine* le = s_.ledger->engine(e.id);
  if (le == nullptr) return;
  Status status = OkStatus();
  if (le->role == LedgerRole::kStandby) {
    status = s_.ledger->FenceStandby(e.id);
  } else if (le->role == LedgerRole::kHolder) {
    Result<uint64_t> epoch = s_.AdvanceEpoch();
    status = epoch.ok() ? s_.ledger->Fence(e.id, *epoch) : epoch.status();
  }
  if (!status.ok())
    BATON_LOG(ERROR, kLog) << "fencing engine " << e.id << ": " << status.ToString();
}

// The engine's process is gone: its blocks move on once the barrier has passed.
void Coordinator::FinishFence(EngineRecord& e) {
  const TimePoint now = s_.clock.Now();
  const EngineId id = e.id;
  const LedgerEngine* le = s_.ledger->engine(id);
  // A holder whose fence could not get a durable epoch earlier is fenced now.
  if (le != nullptr && le->role == LedgerRole::kHolder) FenceInLedger(e);
  le = s_.ledger->engine(id);
  if (le != nullptr && le->role == LedgerRole::kHolder) {
    unfenced_reaped_[id] = e.pid;
    BATON_LOG(ERROR, kLog) << "engine " << id << " is reaped but has no durable epoch to be "
                           << "fenced at: its " << le->blocks
                           << " blocks wait until the epoch journal can be written";
  }
  const bool fenced = le != nullptr && le->role == LedgerRole::kFenced;
  std::optional<PendingFailover> failover;
  if (failover_.has_value() && failover_->old == id) {
    failover = *failover_;
    failover_.reset();
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
  s_.engines.erase(id);
  ReleaseIfDone(id);
  SaveRoster();
}

// --- promotion ----------------------------------------------------------------------------------

// Blocks of a failed holder not yet past the barrier (a promoted engine that died before its
// PromoteAck, or a primary whose fence found no durable epoch): a promotion now would start
// without them, and the exit would free them rather than hand them over.
bool Coordinator::BlocksAwaitBarrier() const {
  if (s_.ledger->Snapshot().quarantined_blocks > 0 || !unfenced_reaped_.empty()) return true;
  for (const auto& [id, e] : s_.engines) {
    const LedgerEngine* le = s_.ledger->engine(id);
    if (!e->live() && le != nullptr && le->role == LedgerRole::kHolder) return true;
  }
  return false;
}

void Coordinator::MaybePromote() {
  if (s_.stopping || s_.primary != kNoEngine || s_.promoting != kNoEngine ||
      failover_.has_value() || !barrier_waits_.empty() || recovery_.has_value() ||
      BlocksAwaitBarrier()) {
    return;
  }
  if (!s_.pair.Allows(PairEvent::kPromoteDone)) return;
  EngineRecord* e = s_.Standby();
  if (e == nullptr || s_.clock.Now() < next_promote_epoch_) return;
  Result<uint64_t> epoch = s_.AdvanceEpoch();
  if (!epoch.ok()) {
    // Each failed try is a journal write and a log line: once a second, not on every tick.
    next_promote_epoch_ = s_.clock.Now() + std::chrono::seconds(1);
    return;
  }
  if (Status promoted = s_.ledger->Promote(e->id, *epoch); !promoted.ok()) {
    BATON_LOG(ERROR, kLog) << "promoting engine " << e->id << ": " << promoted.ToString();
    return;
  }
  const uint32_t free = s_.ledger->GrantableTo(e->id);
  const uint32_t want =
      s_.config.initial_grant_blocks == 0 ? free : std::min(free, s_.config.initial_grant_blocks);
  std::vector<Extent> extents;
  if (want > 0) {
    Result<std::vector<Extent>> granted = s_.ledger->Grant(e->id, want, *epoch);
    if (granted.ok()) extents = std::move(granted).value();
  }
  PromotionRecord* r = s_.timelines.current();
  if (r == nullptr) r = &s_.timelines.Open(PromotionKind::kPromotion, "no primary");
  r->epoch = *epoch;
  r->epoch_durable = s_.clock.Now();
  r->new_engine = e->id;
  SendPromote(*e, *epoch, extents);
}

// --- promotion before the barrier ---------------------------------------------------------------

void Coordinator::SetUpReserve(bool announce) {
  const int configured = s_.config.promotion_reserve_blocks;
  const uint32_t want = configured >= 0 ? static_cast<uint32_t>(configured)
                                        : std::max<uint32_t>(1, s_.config.block_count / 16);
  reserve_note_.clear();
  if (want == 0) {
    reserve_note_ = "the pool keeps no promotion reserve (pool.promotion_reserve_blocks = 0)";
  } else if (Status set = s_.ledger->SetPromotionReserve(want); !set.ok()) {
    reserve_note_ = "the pool is too small for a promotion reserve: " + set.message();
  }
  if (!announce) return;
  if (!reserve_note_.empty()) {
    BATON_LOG(WARN, kLog) << reserve_note_ << "; a promotion waits for the old primary's barrier";
    return;
  }
  BATON_LOG(INFO, kLog) << "promotion reserve: " << s_.ledger->promotion_reserve()
                        << " blocks kept free for a promotion before the old primary's barrier";
}

std::string Coordinator::WhyPromotionWaits(const EngineRecord& s) const {
  if (s.protocol < proto::kProtocolVersionQuarantine) {
    return "engine " + std::to_string(s.id) + " speaks protocol " + std::to_string(s.protocol) +
           ", which has no promotion before the barrier (" +
           std::to_string(proto::kProtocolVersionQuarantine) + ")";
  }
  if (!reserve_note_.empty()) return reserve_note_;
  if (s_.ledger->promotion_reserve() == 0) return "the promotion reserve is lent to an upgrade";
  if (recovery_.has_value()) return "the controller is re-adopting its engines";
  const uint32_t have = s_.ledger->ReserveAvailable();
  if (have < s_.ledger->promotion_reserve()) {
    return "the promotion reserve holds " + std::to_string(have) + " of " +
           std::to_string(s_.ledger->promotion_reserve()) +
           " blocks (it comes back once the last promotion's barrier has passed)";
  }
  return "";
}

// The standby starts now on the reserve, at the epoch the fence reserved for it; the old
// primary's blocks stay quarantined until its barrier, then follow in a Grant (HandOverBlocks).
bool Coordinator::PromoteBeforeBarrier(EngineRecord& s) {
  PromotionRecord* r = s_.timelines.current();
  if (const std::string why = WhyPromotionWaits(s); !why.empty()) {
    if (r != nullptr) r->waited = why;
    BATON_LOG(INFO, kLog) << "engine " << s.id << " is promoted once engine " << failover_->old
                          << " is past its barrier: " << why;
    return false;
  }
  const uint64_t epoch = failover_->epoch;
  if (Status promoted = s_.ledger->Promote(s.id, epoch); !promoted.ok()) {
    BATON_LOG(ERROR, kLog) << "promoting engine " << s.id << ": " << promoted.ToString();
    if (r != nullptr) r->waited = promoted.message();
    return false;
  }
  Result<std::vector<Extent>> reserve = s_.ledger->GrantReserve(s.id, epoch);
  if (!reserve.ok()) {  // checked above: its blocks come after the barrier
    BATON_LOG(ERROR, kLog) << "bug: the reserve for engine " << s.id << ": "
                           << reserve.status().ToString();
    reserve = std::vector<Extent>{};
  }
  failover_->promoted = true;
  std::vector<Extent> quarantined;
  for (const Lease& l : s_.ledger->LeasesOf(failover_->old)) quarantined.push_back(l.extent);
  if (r != nullptr) r->reserve_blocks = BlocksIn(*reserve);
  SendPromote(s, epoch, *reserve, quarantined);
  return true;
}

void Coordinator::SendPromote(EngineRecord& e, uint64_t epoch, const std::vector<Extent>& extents,
                              const std::vector<Extent>& quarantined) {
  const bool canary_step = IsCanary(e.id) && upgrade_->phase == Upgrade::Phase::kPromoting;
  s_.Step(e.machine, EngineEvent::kPromoteStarted);
  s_.promoting = e.id;  // no other engine is launched or promoted meanwhile
  e.deadline = s_.clock.Now() + s_.config.promote_timeout;
  if (PromotionRecord* r = s_.timelines.current(); r != nullptr && !canary_step) {
    r->promote_sent = s_.clock.Now();
    r->new_engine = e.id;
  }
  BATON_LOG(INFO, kLog) << "promoting engine " << e.id << (canary_step ? " as the canary" : "")
                        << " at epoch " << epoch << " with " << BlocksIn(extents) << " blocks in "
                        << extents.size() << " extents";
  BATON_FAILPOINT("before_promote");  // granted in the ledger, not in the roster, not sent
  SaveRoster();                       // before the engine can map them
  if (!quarantined.empty()) {
    const Duration wait_limit = s_.config.promote_timeout / 2;
    const proto::Quarantined q{
        .epoch = epoch,
        .extents = ToRanges(quarantined),
        .barrier_estimate_us = static_cast<uint32_t>(
            std::chrono::duration_cast<std::chrono::microseconds>(BarrierEstimate()).count()),
        .wait_limit_ms = static_cast<uint32_t>(
            std::chrono::duration_cast<std::chrono::milliseconds>(wait_limit).count())};
    if (!SendOrFail(e, q)) return;
  }
  SendOrFail(e, proto::Promote{.epoch = epoch, .extents = ToRanges(extents)});
  BATON_FAILPOINT("after_promote");  // sent, not acknowledged
  s_.CheckInvariants();
}

void Coordinator::OnPromoteAck(EngineRecord& e, const proto::PromoteAck& msg) {
  if (!CheckEpoch(e, msg.epoch, "PromoteAck")) return;
  if (!e.is(EngineState::kPromoting) || msg.epoch == 0) {
    return RefuseEngine(
        e, FailedPrecondition(std::string("PromoteAck in state ") + ToString(e.state())));
  }
  if (IsCanary(e.id) && upgrade_->phase == Upgrade::Phase::kPromoting) {
    return OnCanaryPromoted(e, msg.epoch);
  }
  s_.Step(e.machine, EngineEvent::kPromoteDone);
  s_.promoting = kNoEngine;
  s_.primary = e.id;
  if (IsCanary(e.id)) {
    EndUpgrade(UpgradeOutcome::kPromoted,
               "the primary failed before the canary served; the failover promoted it");
  }
  e.deadline.reset();
  s_.StepPair(PairEvent::kPromoteDone);
  if (s_.Standby() != nullptr) s_.StepPairIfAllowed(PairEvent::kStandbyReady);
  PromotionRecord* r = s_.timelines.current();
  if (r != nullptr) r->promote_acked = s_.clock.Now();
  BATON_LOG(INFO, kLog) << "engine " << e.id << " is the primary at epoch " << msg.epoch << " ("
                        << msg.blocks_mapped << " blocks mapped)";
  SaveRoster();
  PublishRoutes();
  if (r != nullptr) ClosePromotionTimeline();
  RefillReserve();
  MaybeLaunch();
}

void Coordinator::ClosePromotionTimeline() {
  PromotionRecord* r = s_.timelines.current();
  if (r == nullptr) return;
  BATON_LOG(INFO, kLog) << TimelineLog::Summary(*r);
  s_.timelines.Close("serving");
  s_.relaunch_not_before = s_.clock.Now() + s_.config.standby_relaunch_delay;
  if (s_.config.standby_relaunch_delay > Duration::zero() && s_.LiveEngines() < 2) {
    BATON_LOG(INFO, kLog) << "the replacement standby starts in "
                          << MillisBetween(s_.clock.Now(), s_.relaunch_not_before)
                          << " ms (policy.standby_relaunch_delay_ms)";
  }
}

void Coordinator::OnDrained(EngineRecord& e, const proto::Drained& msg) {
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

void Coordinator::OnKvAdopted(EngineRecord& e, const proto::KvAdopted& msg) {
  if (!CheckEpoch(e, msg.epoch, "KvAdopted")) return;
  constexpr size_t kMaxReasons = 16;
  constexpr size_t kMaxReasonBytes = 32;
  bool sane = msg.epoch != 0 && msg.dropped_reasons.size() == msg.dropped_counts.size() &&
              msg.dropped_reasons.size() <= kMaxReasons;
  for (const std::string& reason : msg.dropped_reasons) {
    sane = sane && !reason.empty() && reason.size() <= kMaxReasonBytes &&
           std::all_of(reason.begin(), reason.end(),
                       [](char c) { return (c >= 'a' && c <= 'z') || c == '_'; });
  }
  if (!sane) {  // a report, not a claim on memory: refused, nothing else changes
    return s_.Refused("engine " + std::to_string(e.id), "malformed KvAdopted");
  }
  PromotionRecord::KvAdoption kv;
  kv.adopted = msg.adopted;
  kv.tokens = msg.tokens;
  kv.read_ms = msg.micros / 1e3;
  for (size_t i = 0; i < msg.dropped_reasons.size(); ++i) {
    kv.dropped[msg.dropped_reasons[i]] += msg.dropped_counts[i];
  }
  BATON_LOG(INFO, kLog) << "engine " << e.id << " at epoch " << msg.epoch << " "
                        << KvAdoptionText(kv);
  if (PromotionRecord* r = s_.timelines.Promoted(e.id, msg.epoch); r != nullptr) {
    r->kv_adopted = s_.clock.Now();
    r->kv = std::move(kv);
  }
}

void Coordinator::OnKvInherited(EngineRecord& e, const proto::KvInherited& msg) {
  if (!CheckEpoch(e, msg.epoch, "KvInherited")) return;
  if (msg.epoch == 0 || msg.mode > static_cast<uint8_t>(proto::KvInheritMode::kWaited)) {
    return s_.Refused("engine " + std::to_string(e.id), "malformed KvInherited");
  }
  const PromotionRecord::KvInheritance kv{.mode = static_cast<proto::KvInheritMode>(msg.mode),
                                          .blocks = msg.blocks,
                                          .bytes = msg.bytes,
                                          .ms = msg.micros / 1e3,
                                          .estimate_ms = msg.estimate_us / 1e3};
  BATON_LOG(INFO, kLog) << "engine " << e.id << " at epoch " << msg.epoch
                        << ", the quarantined kv: " << InheritanceText(kv);
  if (PromotionRecord* r = s_.timelines.Promoted(e.id, msg.epoch); r != nullptr) {
    r->kv_inherited = kv;
  }
}

}  // namespace baton
