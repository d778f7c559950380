// FailoverPart: promotions, on the reserve before the old primary's barrier or with its blocks
// after it; SendPromote is the one place a Promote is sent.
#include <algorithm>

#include "base/bug.h"
#include "base/failpoint.h"
#include "base/log.h"
#include "controller/core/coordinator_parts.h"

namespace baton {

namespace {

constexpr const char* kLog = "controller";

}  // namespace

// Blocks of a failed holder not yet past the barrier (a promoted engine that died before its
// PromoteAck, or a primary whose fence found no durable epoch): a promotion now would start
// without them, and the exit would free them rather than hand them over.
bool FailoverPart::BlocksAwaitBarrier() const {
  if (s_.ledger->Snapshot().quarantined_blocks > 0 || !own_.unfenced_reaped.empty()) return true;
  for (const auto& [id, e] : s_.engines) {
    const LedgerEngine* le = s_.ledger->engine(id);
    if (!e->live() && le != nullptr && le->role == LedgerRole::kHolder) return true;
  }
  return false;
}

EngineRecord* FailoverPart::Successor() {
  EngineRecord* e = s_.Standby();
  if (e == nullptr || !e->detector.has_value() || !e->detector->Silent()) return e;
  return nullptr;
}

void FailoverPart::MaybePromote() {
  if (s_.stopping || s_.primary != kNoEngine || s_.promoting != kNoEngine ||
      own_.failover.has_value() || !own_.barrier_waits.empty() || p_.recovery->active() ||
      BlocksAwaitBarrier()) {
    return;
  }
  if (!s_.pair.Allows(PairEvent::kPromoteDone)) return;
  EngineRecord* e = Successor();
  if (e == nullptr || s_.clock.Now() < own_.next_promote_epoch) return;
  Result<uint64_t> epoch = s_.AdvanceEpoch();
  if (!epoch.ok()) {
    // Each failed try is a journal write and a log line: once a second, not on every tick.
    own_.next_promote_epoch = s_.clock.Now() + std::chrono::seconds(1);
    return;
  }
  if (Status promoted = s_.ledger->Promote(e->id, *epoch); !promoted.ok()) {
    BATON_BUG("ledger") << "promoting engine " << e->id << ": " << promoted.ToString();
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

void FailoverPart::SetUpReserve(bool announce) {
  const int configured = s_.config.promotion_reserve_blocks;
  const uint32_t want = configured >= 0 ? static_cast<uint32_t>(configured)
                                        : std::max<uint32_t>(1, s_.config.block_count / 16);
  own_.reserve_note.clear();
  if (want == 0) {
    own_.reserve_note = "the pool keeps no promotion reserve (pool.promotion_reserve_blocks = 0)";
  } else if (Status set = s_.ledger->SetPromotionReserve(want); !set.ok()) {
    own_.reserve_note = "the pool is too small for a promotion reserve: " + set.message();
  }
  if (!announce) return;
  if (!own_.reserve_note.empty()) {
    BATON_LOG(WARN, kLog) << own_.reserve_note
                          << "; a promotion waits for the old primary's barrier";
    return;
  }
  BATON_LOG(INFO, kLog) << "promotion reserve: " << s_.ledger->promotion_reserve()
                        << " blocks kept free for a promotion before the old primary's barrier";
}

std::string FailoverPart::WhyPromotionWaits(const EngineRecord& s) const {
  if (s.protocol < proto::kProtocolVersionQuarantine) {
    return "engine " + std::to_string(s.id) + " speaks protocol " + std::to_string(s.protocol) +
           ", which has no promotion before the barrier (" +
           std::to_string(proto::kProtocolVersionQuarantine) + ")";
  }
  if (!own_.reserve_note.empty()) return own_.reserve_note;
  if (s_.ledger->promotion_reserve() == 0) return "the promotion reserve is lent to an upgrade";
  if (p_.recovery->active()) return "the controller is re-adopting its engines";
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
bool FailoverPart::PromoteBeforeBarrier(EngineRecord& s) {
  PromotionRecord* r = s_.timelines.current();
  if (const std::string why = WhyPromotionWaits(s); !why.empty()) {
    if (r != nullptr) r->waited = why;
    BATON_LOG(INFO, kLog) << "engine " << s.id << " is promoted once engine " << own_.failover->old
                          << " is past its barrier: " << why;
    return false;
  }
  uint64_t epoch = own_.failover->epoch;
  if (s_.mutation == CoordinatorMutation::kPromoteAtOldEpoch) {
    if (const LedgerEngine* old = s_.ledger->engine(own_.failover->old)) epoch = old->epoch;
  }
  if (Status promoted = s_.ledger->Promote(s.id, epoch); !promoted.ok()) {
    BATON_BUG("ledger") << "promoting engine " << s.id << ": " << promoted.ToString();
    if (r != nullptr) r->waited = promoted.message();
    return false;
  }
  Result<std::vector<Extent>> reserve = s_.ledger->GrantReserve(s.id, epoch);
  if (!reserve.ok()) {  // checked above: its blocks come after the barrier
    BATON_BUG("ledger") << "the reserve for engine " << s.id << ": " << reserve.status().ToString();
    reserve = std::vector<Extent>{};
  }
  own_.failover->promoted = true;
  std::vector<Extent> quarantined;
  for (const Lease& l : s_.ledger->LeasesOf(own_.failover->old)) quarantined.push_back(l.extent);
  if (r != nullptr) r->reserve_blocks = BlocksIn(*reserve);
  SendPromote(s, epoch, *reserve, quarantined);
  return true;
}

void FailoverPart::SendPromote(EngineRecord& e, uint64_t epoch, const std::vector<Extent>& extents,
                               const std::vector<Extent>& quarantined) {
  const bool canary_step = p_.upgrades->PromotingCanary(e.id);
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
  p_.engines->SaveRoster();           // before the engine can map them
  if (!quarantined.empty()) {
    const Duration wait_limit = s_.config.promote_timeout / 2;
    const proto::Quarantined q{
        .epoch = epoch,
        .extents = ToRanges(quarantined),
        .barrier_estimate_us = static_cast<uint32_t>(
            std::chrono::duration_cast<std::chrono::microseconds>(BarrierEstimate()).count()),
        .wait_limit_ms = static_cast<uint32_t>(
            std::chrono::duration_cast<std::chrono::milliseconds>(wait_limit).count())};
    if (!p_.engines->SendOrFail(e, q)) return;
  }
  p_.engines->SendOrFail(e, proto::Promote{.epoch = epoch, .extents = ToRanges(extents)});
  BATON_FAILPOINT("after_promote");  // sent, not acknowledged
  s_.CheckInvariants();
}

void FailoverPart::OnPromoteAck(EngineRecord& e, const proto::PromoteAck& msg) {
  if (!p_.engines->CheckEpoch(e, msg.epoch, "PromoteAck")) return;
  if (!e.is(EngineState::kPromoting) || msg.epoch == 0) {
    return p_.engines->RefuseEngine(
        e, FailedPrecondition(std::string("PromoteAck in state ") + ToString(e.state())));
  }
  if (p_.upgrades->PromotingCanary(e.id)) {
    return p_.upgrades->OnCanaryPromoted(e, msg.epoch);
  }
  if (p_.recovery->HoldsCanary(e.id)) {
    e.held_promote_ack = msg.epoch;
    e.deadline.reset();  // it answered: not a promotion that hangs
    BATON_LOG(INFO, kLog) << "engine " << e.id << " (the canary) serves at epoch " << msg.epoch
                          << ": held until the interrupted upgrade resumes";
    return;
  }
  s_.Step(e.machine, EngineEvent::kPromoteDone);
  s_.promoting = kNoEngine;
  s_.primary = e.id;
  if (p_.upgrades->IsCanary(e.id)) {
    p_.upgrades->EndUpgrade(
        UpgradeOutcome::kPromoted,
        "the primary failed before the canary served; the failover promoted it");
  }
  e.deadline.reset();
  s_.StepPair(PairEvent::kPromoteDone);
  if (s_.Standby() != nullptr) s_.StepPairIfAllowed(PairEvent::kStandbyReady);
  PromotionRecord* r = s_.timelines.current();
  if (r != nullptr) {
    r->promote_acked = s_.clock.Now();
    r->replacement_awaited = s_.Standby() == nullptr;
  }
  BATON_LOG(INFO, kLog) << "engine " << e.id << " is the primary at epoch " << msg.epoch << " ("
                        << msg.blocks_mapped << " blocks mapped)";
  p_.engines->SaveRoster();
  p_.engines->PublishRoutes();
  if (r != nullptr) ClosePromotionTimeline();
  RefillReserve();
  p_.engines->MaybeLaunch();
}

void FailoverPart::ClosePromotionTimeline() {
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

}  // namespace baton
