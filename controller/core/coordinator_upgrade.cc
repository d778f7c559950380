// UpgradePart: engine-version upgrades by lossless canary (controller/core/upgrade.h).
#include "base/failpoint.h"
#include "base/log.h"
#include "controller/core/coordinator_parts.h"

namespace baton {

namespace {

constexpr const char* kLog = "upgrade";
// How long the primary has to answer the Reclaim of the canary's first blocks; after it the
// canary is promoted with the blocks that are free.
constexpr Duration kReclaimTimeout = std::chrono::seconds(2);

// The canary's share of the pool at `weight` %. The primary keeps a tenth even at 100 %: its
// requests in flight finish there, and the canary's failed attempts are retried there. On a
// device pool the share is whole chunks (the unit engines map), at most those that leave the
// primary its tenth.
uint32_t CanaryTarget(const CoordinatorState& s, uint32_t weight) {
  const uint64_t blocks = s.config.block_count;
  const uint64_t most = blocks - UpgradePart::PrimaryKeeps(s.config);
  uint64_t share = std::min(blocks * weight / 100, most);
  const uint64_t chunk = s.ledger->blocks_per_chunk();
  if (chunk > 1)
    share = std::min<uint64_t>(s.WholeChunks(static_cast<uint32_t>(share)), most / chunk * chunk);
  return std::max<uint32_t>(1, static_cast<uint32_t>(share));
}

}  // namespace

UpgradePart::UpgradePart(CoordinatorState& s, const CoordinatorParts& p) : s_(s), p_(p) {}

const std::vector<std::string>& UpgradePart::active_command() const {
  return own_.active_command.empty() ? s_.config.engine_command : own_.active_command;
}

// --- phases -------------------------------------------------------------------------------------

std::vector<std::string> UpgradePart::CommandFor(EngineId id, proto::LaunchRole role) {
  if (own_.upgrade.has_value() && own_.upgrade->phase == Upgrade::Phase::kLaunching &&
      own_.upgrade->canary == kNoEngine && role == proto::LaunchRole::kStandby) {
    own_.upgrade->canary = id;
    SaveCommands();
    BATON_LOG(INFO, kLog) << "engine " << id << " is the canary";
    return own_.upgrade->command;
  }
  return active_command();
}

void UpgradePart::SetPhase(Upgrade::Phase phase) {
  BATON_LOG(INFO, kLog) << ToString(own_.upgrade->kind) << ": " << ToString(own_.upgrade->phase)
                        << " -> " << ToString(phase) << " (engine " << own_.upgrade->canary << ")";
  own_.upgrade->phase = phase;
  own_.upgrade->phase_since = s_.clock.Now();
  own_.upgrade->deadline.reset();
  SaveCommands();
}

void UpgradePart::ReclaimFromPrimary(uint32_t weight) {
  EngineRecord* p = s_.Find(s_.primary);
  const LedgerEngine* c = s_.ledger->engine(own_.upgrade->canary);
  const uint32_t held = c != nullptr && c->role == LedgerRole::kHolder ? c->blocks : 0;
  const uint32_t target = CanaryTarget(s_, weight);
  const uint32_t free = s_.ledger->GrantableTo(own_.upgrade->canary);
  const LedgerEngine* pl = p != nullptr ? s_.ledger->engine(p->id) : nullptr;
  if (p == nullptr || !p->connected || pl == nullptr || held + free >= target) return;
  // One at a time: two answers to the same holdings could give away what the primary keeps.
  const bool pending = s_.reclaim.from == p->id;
  if (pending && s_.clock.Now() < s_.reclaim.sent + CoordinatorState::kReclaimAnswerTimeout) return;
  const uint32_t asked = pending ? s_.reclaim.blocks : 0;
  // Whole chunks, and never into what the primary keeps (a short last chunk included).
  const uint32_t chunk = s_.ledger->blocks_per_chunk();
  const uint32_t keep = PrimaryKeeps(s_.config) + asked;
  const uint32_t spare = pl->blocks > keep ? pl->blocks - keep : 0;
  const uint32_t want = std::min(s_.WholeChunks(target - held - free), spare / chunk * chunk);
  if (want == 0) return;
  if (pending) {
    BATON_LOG(WARN, kLog) << "engine " << p->id << " (the primary) did not answer its Reclaim of "
                          << asked << " blocks for the canary in "
                          << MillisBetween(s_.reclaim.sent, s_.clock.Now())
                          << " ms: it is asked for " << want << " more";
  }
  BATON_LOG(INFO, kLog) << "asking engine " << p->id << " (the primary) to return " << want
                        << " blocks for the canary's " << weight << " % step";
  if (!p_.engines->SendOrFail(*p, proto::Reclaim{.epoch = pl->epoch, .blocks = want})) return;
  s_.reclaim = PendingReclaim{.from = p->id, .blocks = asked + want, .sent = s_.clock.Now()};
}

void UpgradePart::StartCanary(EngineRecord& e) {
  if (s_.stopping || !e.is(EngineState::kStandby)) return;  // a failover promoted it instead
  SetPhase(Upgrade::Phase::kReclaiming);
  own_.upgrade->deadline = s_.clock.Now() + kReclaimTimeout;
  ReclaimFromPrimary(own_.upgrade->policy.steps.front());
  if (own_.upgrade.has_value() && s_.ledger->GrantableTo(own_.upgrade->canary) >=
                                      CanaryTarget(s_, own_.upgrade->policy.steps.front())) {
    PromoteCanary();
  }
}

void UpgradePart::PromoteCanary() {
  EngineRecord* c = s_.Find(own_.upgrade->canary);
  if (s_.stopping || c == nullptr || !c->live() || !c->is(EngineState::kStandby)) return;
  Result<uint64_t> epoch = s_.AdvanceEpoch();
  if (!epoch.ok()) return RollBackCanary("no durable epoch: " + epoch.status().message());
  if (Status promoted = s_.ledger->Promote(c->id, *epoch); !promoted.ok()) {
    return RollBackCanary("promoting the canary: " + promoted.message());
  }
  const uint32_t free = s_.ledger->GrantableTo(c->id);
  const uint32_t want = std::min(free, CanaryTarget(s_, own_.upgrade->policy.steps.front()));
  std::vector<Extent> extents;
  if (want > 0) {
    Result<std::vector<Extent>> granted = s_.ledger->Grant(c->id, want, *epoch);
    if (granted.ok()) extents = std::move(granted).value();
  }
  SetPhase(Upgrade::Phase::kPromoting);
  // Its machine's "primary" is a serving state; the role it serves in is the canary's.
  c->machine.set_name("engine " + std::to_string(c->id) + " (canary)");
  BATON_FAILPOINT("canary_promoting");  // the canary's blocks granted, its Promote not sent
  p_.failover->SendPromote(*c, *epoch, extents);
}

void UpgradePart::OnCanaryPromoted(EngineRecord& e, uint64_t epoch) {
  s_.Step(e.machine, EngineEvent::kPromoteDone);
  s_.promoting = kNoEngine;
  e.deadline.reset();
  p_.engines->SaveRoster();
  if (s_.primary == kNoEngine) {  // the primary failed while the canary was promoted
    s_.primary = e.id;
    s_.StepPairIfAllowed(PairEvent::kPromoteDone);
    own_.give_back_blocks = true;
    EndUpgrade(UpgradeOutcome::kPromoted,
               "the primary failed while the canary was promoted; it serves alone");
    p_.engines->SaveRoster();
    p_.engines->PublishRoutes();
    if (PromotionRecord* r = s_.timelines.current()) {
      r->new_engine = e.id;
      r->epoch = epoch;  // the canary's, not the old primary's fence epoch
      r->promote_acked = r->route_published = s_.clock.Now();
      s_.timelines.Close("serving: the canary took over");
    }
    s_.relaunch_not_before = s_.clock.Now() + s_.config.standby_relaunch_delay;
    p_.engines->MaybeLaunch();
    return;
  }
  SetPhase(Upgrade::Phase::kCanary);
  own_.upgrade->judge.emplace(s_.clock, own_.upgrade->policy, s_.primary, e.id,
                              s_.effects.RouterOutcomes());
  SaveCommands();                       // with the first step's weight
  BATON_FAILPOINT("mid_upgrade_step");  // the step recorded, the canary's blocks not moved
  BATON_LOG(INFO, kLog) << "engine " << e.id << " (version " << e.version
                        << ") serves as the canary at epoch " << epoch << ": "
                        << own_.upgrade->judge->weight() << " % of new requests";
  p_.engines->PublishRoutes();
}

void UpgradePart::TickUpgrade() {
  if (!own_.upgrade.has_value() || s_.stopping || p_.recovery->active()) return;
  EngineRecord* c = s_.Find(own_.upgrade->canary);
  const EngineRecord* p = s_.Find(s_.primary);
  const bool primary_serves = p != nullptr && p->serving();
  if (own_.upgrade->phase == Upgrade::Phase::kLaunching && c != nullptr && c->live() &&
      c->is(EngineState::kStandby) && primary_serves) {
    return StartCanary(*c);  // it became ready while the primary could not lend it blocks
  }
  if (own_.upgrade->phase == Upgrade::Phase::kReclaiming && own_.upgrade->deadline.has_value() &&
      s_.clock.Now() >= *own_.upgrade->deadline && c != nullptr && c->is(EngineState::kStandby)) {
    BATON_LOG(WARN, kLog) << "the primary did not return blocks in time; the canary starts with "
                          << s_.ledger->GrantableTo(own_.upgrade->canary) << " free blocks";
    return PromoteCanary();
  }
  if (own_.upgrade->phase == Upgrade::Phase::kCanary) TickCanary();
}

void UpgradePart::TickCanary() {
  GrantFreeToCanary();
  if (!own_.upgrade.has_value()) return;  // the Grant could not be sent: the canary failed
  if (s_.clock.Now() >= own_.upgrade->next_reclaim) {  // the primary may have freed blocks since
    own_.upgrade->next_reclaim = s_.clock.Now() + kReclaimTimeout;
    ReclaimFromPrimary(own_.upgrade->judge->weight());
    if (!own_.upgrade.has_value()) return;  // the primary failed: the canary took over
  }
  const OutcomeMap now = s_.effects.RouterOutcomes();
  const CanaryJudge::Judgement j = own_.upgrade->judge->Judge(now);
  own_.upgrade->judgement = j.reason;
  if (j.verdict == CanaryJudge::Verdict::kHold && s_.effects.RouterCount() == 0) {
    own_.upgrade->judgement +=
        " (no router is subscribed or reports through etcd: nothing is seen, so nothing is "
        "judged)";
  }
  switch (j.verdict) {
    case CanaryJudge::Verdict::kHold:
      return;
    case CanaryJudge::Verdict::kRollback:
      return RollBackCanary(j.reason);
    case CanaryJudge::Verdict::kPromote:
      if (!j.reason.empty())
        BATON_LOG(WARN, kLog) << "canary engine " << own_.upgrade->canary << ": " << j.reason;
      return FinishUpgrade();
    case CanaryJudge::Verdict::kAdvance:
      own_.upgrade->judge->Advance(now);
      SaveCommands();
      BATON_FAILPOINT("mid_upgrade_step");  // the step recorded, the canary's blocks not moved
      BATON_LOG(INFO, kLog) << "canary engine " << own_.upgrade->canary << " passed its step: now "
                            << own_.upgrade->judge->weight() << " % of new requests";
      own_.upgrade->next_reclaim = s_.clock.Now() + kReclaimTimeout;
      ReclaimFromPrimary(own_.upgrade->judge->weight());
      if (!own_.upgrade.has_value()) return;  // the primary failed: the canary took over
      GrantFreeToCanary();
      p_.engines->PublishRoutes();
      return;
  }
}

void UpgradePart::GrantFreeToCanary() {
  EngineRecord* c = s_.Find(own_.upgrade->canary);
  const LedgerEngine* le = s_.ledger->engine(own_.upgrade->canary);
  if (c == nullptr || !c->serving() || le == nullptr || le->role != LedgerRole::kHolder) return;
  const uint32_t target = CanaryTarget(s_, own_.upgrade->judge->weight());
  const uint32_t free = s_.ledger->GrantableTo(c->id);
  const uint32_t want = std::min(free, target > le->blocks ? target - le->blocks : 0);
  if (want > 0) p_.engines->GrantFree(*c, want, "the canary");
}

void UpgradePart::FinishUpgrade() {
  EngineRecord* p = s_.Find(s_.primary);
  if (p == nullptr || !p->serving() || !s_.pair.Allows(PairEvent::kGracefulPromoteRequested)) {
    own_.upgrade->judgement = "waiting for the pair to settle before the canary takes over";
    return;
  }
  if (!p_.commands->CheckNoCalledOffDrain(*p).ok()) return;
  SetPhase(Upgrade::Phase::kFinishing);
  s_.StepPair(PairEvent::kGracefulPromoteRequested);
  p_.commands->OpenPlannedTimeline(PromotionKind::kUpgrade, "canary passed every step", *p,
                                   own_.upgrade->canary);
  BATON_LOG(INFO, kLog) << "canary engine " << own_.upgrade->canary
                        << " passed every step: draining engine " << p->id
                        << ", the old primary; the canary takes over";
  p_.commands->DrainEngine(*p, /*successor=*/true);
  p_.engines->PublishRoutes();
}

void UpgradePart::RollBackCanary(const std::string& reason) {
  own_.upgrade->rollback_reason = reason;
  EngineRecord* c = s_.Find(own_.upgrade->canary);
  BATON_LOG(WARN, kLog) << "rolling back canary engine " << own_.upgrade->canary << ": " << reason;
  if (c == nullptr || !c->live()) return EndUpgrade(UpgradeOutcome::kRolledBack, reason);
  if (!c->serving())
    return p_.failover->Fence(c->id, FailCause::kShutdown, "rolled back: " + reason);
  if (s_.mutation == CoordinatorMutation::kRollbackKeepsCanary)
    return EndUpgrade(UpgradeOutcome::kRolledBack, reason);
  SetPhase(Upgrade::Phase::kRollingBack);
  p_.commands->DrainEngine(*c, /*successor=*/true);
  p_.engines->PublishRoutes();
}

void UpgradePart::OnCanaryGone(EngineRecord& e) {
  const std::string why =
      !own_.upgrade->rollback_reason.empty()
          ? own_.upgrade->rollback_reason
          : "the canary failed: " + std::string(ToString(*e.fail_cause)) + ": " + e.fail_reason;
  own_.give_back_blocks = true;
  EndUpgrade(UpgradeOutcome::kRolledBack, why);
}

bool UpgradePart::CanaryTakesOver(EngineId old, const std::string& lost) {
  if (!own_.upgrade.has_value()) return false;
  EngineRecord* c = s_.Find(own_.upgrade->canary);
  if (c == nullptr || !c->live()) return false;
  if (s_.effects.Dying(c->id)) {
    // Died with the primary (kill -9 of both, a host's OOM killer): its own death, next,
    // rolls the upgrade back; promoting it now would switch the command to one never judged.
    // A canary merely silent does take over (nothing else would move the upgrade on once it
    // answers); if it never answers, its first heartbeat never comes (OnPrimaryFailed).
    BATON_LOG(WARN, kLog) << "engine " << c->id << " (the canary) is dying too: it does not take "
                          << "over from engine " << old;
    return false;
  }
  (void)p_.commands->ResumeEngine(*c);  // a rollback in progress is called off
  if (!c->serving()) return false;
  s_.primary = c->id;
  s_.StepPairIfAllowed(PairEvent::kPromoteDone);
  own_.give_back_blocks = true;
  const bool planned = own_.upgrade->phase == Upgrade::Phase::kFinishing;
  if (PromotionRecord* r = s_.timelines.current()) {
    r->new_engine = c->id;
    // The canary serves on at the epoch it was promoted at as the canary, not at the old
    // primary's fence epoch.
    if (const LedgerEngine* le = s_.ledger->engine(c->id)) r->epoch = le->epoch;
    r->promote_acked = s_.clock.Now();
  }
  BATON_LOG(INFO, kLog) << "engine " << c->id << " (the canary) is the primary; engine " << old
                        << " is " << (planned ? "drained" : "lost: " + lost);
  if (!planned) {
    own_.takeover = UpgradeFields::Takeover{.canary = c->id,
                                            .at = s_.clock.Now(),
                                            .active_command = own_.active_command,
                                            .previous_command = own_.previous_command};
  }
  EndUpgrade(UpgradeOutcome::kPromoted,
             planned ? "passed every step" : "the primary failed during the canary: " + lost);
  p_.engines->SaveRoster();
  p_.engines->PublishRoutes();
  if (PromotionRecord* r = s_.timelines.current()) {
    r->route_published = s_.clock.Now();
    s_.timelines.Close("serving");
  }
  s_.relaunch_not_before = s_.clock.Now() + s_.config.standby_relaunch_delay;
  return true;
}

void UpgradePart::OnHeartbeat(EngineId id) {
  // One read just after the takeover may have been sent before the canary died.
  if (!own_.takeover.has_value() || own_.takeover->canary != id ||
      s_.clock.Now() - own_.takeover->at < s_.config.heartbeat_interval) {
    return;
  }
  own_.takeover.reset();
  BATON_LOG(INFO, kLog) << "engine " << id << " (the canary) outlived the primary it took over "
                        << "from: its upgrade stands";
}

void UpgradePart::OnPrimaryFailed(const EngineRecord& e) {
  if (!own_.takeover.has_value() || own_.takeover->canary != e.id) return;
  UpgradeFields::Takeover t = *std::move(own_.takeover);
  own_.takeover.reset();
  own_.active_command = std::move(t.active_command);
  own_.previous_command = std::move(t.previous_command);
  for (auto it = own_.history.rbegin(); it != own_.history.rend(); ++it) {
    if (it->canary != e.id || it->outcome != UpgradeOutcome::kPromoted) continue;
    it->outcome = UpgradeOutcome::kRolledBack;
    it->reason += "; then the canary failed too, before its first heartbeat since";
    --own_.promoted;
    ++own_.rolled_back;
    break;
  }
  BATON_LOG(WARN, kLog) << "engine " << e.id << " (the canary that took over) failed before its "
                        << "first heartbeat since: taken to have died with the old primary; its "
                        << "upgrade is rolled back, standbys run: " << Joined(active_command());
  SaveCommands();  // standbys of the new command are retired on the next tick
}

void UpgradePart::EndUpgrade(UpgradeOutcome outcome, const std::string& reason) {
  UpgradeResult res{
      .kind = own_.upgrade->kind,
      .outcome = outcome,
      .reason = reason,
      .canary = own_.upgrade->canary,
      .version = "",
      .last_weight = own_.upgrade->judge.has_value() ? own_.upgrade->judge->weight() : 0,
      .started = own_.upgrade->started,
      .ended = s_.clock.Now()};
  if (EngineRecord* c = s_.Find(own_.upgrade->canary)) {
    res.version = c->version;
    c->machine.set_name("engine " + std::to_string(c->id));  // the primary, or on its way out
  }
  if (outcome == UpgradeOutcome::kPromoted) {
    own_.previous_command = own_.upgrade->previous;
    own_.active_command = own_.upgrade->command;
    ++own_.promoted;
  } else {
    ++own_.rolled_back;
  }
  BATON_LOG(INFO, kLog) << ToString(own_.upgrade->kind) << " " << ToString(outcome) << " (engine "
                        << res.canary << "): " << reason
                        << "; standbys now run: " << Joined(active_command());
  own_.history.push_back(std::move(res));
  if (own_.history.size() > kKeepUpgrades) own_.history.pop_front();
  own_.upgrade.reset();
  p_.failover->SetUpReserve(
      /*announce=*/false);  // back, and refilled from the primary (RefillReserve)
  SaveCommands();
}

// While a canary runs beside the primary there is no standby to promote (a failing primary
// is replaced by the canary, which holds blocks of its own): the reserve's blocks are part of
// what the canary's share is counted from.
void UpgradePart::LendReserveToCanary() {
  if (s_.ledger->promotion_reserve() == 0) return;
  BATON_LOG(INFO, kLog) << "the promotion reserve's " << s_.ledger->promotion_reserve()
                        << " blocks are lent to the upgrade until it ends";
  (void)s_.ledger->SetPromotionReserve(0);
}

void UpgradePart::GiveFreeBlocksToPrimary() {
  if (!own_.give_back_blocks || own_.upgrade.has_value() || s_.config.initial_grant_blocks != 0)
    return;
  EngineRecord* p = s_.Find(s_.primary);
  const LedgerEngine* le = s_.ledger->engine(s_.primary);
  if (p == nullptr || !p->serving() || !p->connected || le == nullptr ||
      le->role != LedgerRole::kHolder || p_.failover->BlocksAwaitBarrier()) {
    return;
  }
  own_.give_back_blocks = false;
  const uint32_t free = s_.ledger->GrantableTo(p->id);
  if (free > 0) p_.engines->GrantFree(*p, free, "the primary");
}

void UpgradePart::RetireStaleStandbys() {
  if (own_.upgrade.has_value() || s_.stopping || p_.recovery->active()) return;
  std::vector<EngineId> stale;
  for (const auto& [id, e] : s_.engines) {
    if (id == s_.primary || !e->live() || e->command == active_command()) continue;
    if (e->is(EngineState::kLaunching) || e->is(EngineState::kRegistering) ||
        e->is(EngineState::kStandby)) {
      stale.push_back(id);
    }
  }
  for (EngineId id : stale) {
    BATON_LOG(INFO, kLog) << "engine " << id << " runs the command an upgrade replaced: stopped";
    p_.failover->Fence(id, FailCause::kShutdown, "runs the engine command an upgrade replaced");
  }
}

}  // namespace baton
