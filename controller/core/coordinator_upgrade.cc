// Coordinator: engine-version upgrades by lossless canary (controller/upgrade/upgrade.h).
#include "base/failpoint.h"
#include "base/log.h"
#include "controller/core/coordinator.h"

namespace baton {
namespace {

constexpr const char* kLog = "upgrade";
// How long the primary has to answer the Reclaim of the canary's first blocks; after it the
// canary is promoted with the blocks that are free.
constexpr Duration kReclaimTimeout = std::chrono::seconds(2);

}  // namespace

const std::vector<std::string>& Coordinator::active_command() const {
  return active_command_.empty() ? s_.config.engine_command : active_command_;
}

// --- operator commands --------------------------------------------------------------------------

Status Coordinator::RequestUpgrade(UpgradeRequest request) {
  if (s_.stopping) return Unavailable("the controller is shutting down");
  if (upgrade_.has_value()) {
    return FailedPrecondition(std::string("an upgrade is already in progress (phase ") +
                              ToString(upgrade_->phase) + "); roll it back or let it finish");
  }
  if (request.command.empty()) return InvalidArgument("upgrade: no engine command given");
  EngineRecord* p = s_.Find(s_.primary);
  EngineRecord* s = s_.Standby();
  if (s_.pair.state() != PairState::kReady || p == nullptr || !p->serving() || s == nullptr) {
    return FailedPrecondition(std::string("an upgrade needs a serving primary and a ready "
                                          "standby (pair is ") +
                              ToString(s_.pair.state()) + ")");
  }
  BATON_RETURN_IF_ERROR(CheckNoCalledOffDrain(*p));
  if (const uint32_t chunk = s_.ledger->blocks_per_chunk();
      (s_.config.block_count - PrimaryKeeps()) / chunk == 0) {
    // Engines map the device pool by whole chunks: the canary needs one of its own.
    return FailedPrecondition(
        "the device pool is " + std::to_string(s_.config.block_count) + " blocks in chunks of " +
        std::to_string(chunk) + ": a canary needs a chunk of its own while the primary keeps " +
        std::to_string(PrimaryKeeps()) + " blocks; make gpu.pool_chunk_bytes smaller");
  }
  Upgrade u;
  u.policy = s_.config.canary;
  if (request.steps.has_value()) u.policy.steps = *request.steps;
  if (request.step_duration.has_value()) u.policy.step_duration = *request.step_duration;
  if (request.min_requests.has_value()) u.policy.min_requests = *request.min_requests;
  BATON_RETURN_IF_ERROR(ValidateCanaryPolicy(u.policy));
  u.command = std::move(request.command);
  u.previous = active_command();
  u.primary = p->id;
  u.started = s_.clock.Now();
  u.phase_since = u.started;
  upgrade_ = std::move(u);
  LendReserveToCanary();
  SaveCommands();
  BATON_LOG(INFO, kLog) << "upgrade: engine " << s->id
                        << " (the standby) makes way for a canary of: "
                        << Joined(upgrade_->command);
  Fail(s->id, FailCause::kShutdown, "replaced by the canary of an upgrade");
  return OkStatus();
}

Status Coordinator::RequestRollback(UpgradeRequest overrides) {
  if (s_.stopping) return Unavailable("the controller is shutting down");
  if (upgrade_.has_value()) {
    if (upgrade_->phase == Upgrade::Phase::kRollingBack) {
      return FailedPrecondition("the canary is already being rolled back");
    }
    if (upgrade_->phase == Upgrade::Phase::kFinishing) {
      return FailedPrecondition(
          "the canary already takes over as primary; roll back once it serves");
    }
    if (s_.primary == kNoEngine) {
      // Stopping the canary now would leave no engine at all: a cold start.
      return FailedPrecondition(
          "the primary failed during the upgrade and no engine serves yet; roll back once one "
          "does");
    }
    RollBackCanary("batonctl rollback");
    return OkStatus();
  }
  if (previous_command_.empty()) {
    return FailedPrecondition("nothing to roll back: no upgrade has been promoted");
  }
  overrides.command = previous_command_;
  Status started = RequestUpgrade(std::move(overrides));
  if (started.ok()) {
    upgrade_->kind = UpgradeKind::kRollback;
    SaveCommands();
  }
  return started;
}

// --- phases -------------------------------------------------------------------------------------

std::vector<std::string> Coordinator::CommandFor(EngineId id, proto::LaunchRole role) {
  if (upgrade_.has_value() && upgrade_->phase == Upgrade::Phase::kLaunching &&
      upgrade_->canary == kNoEngine && role == proto::LaunchRole::kStandby) {
    upgrade_->canary = id;
    SaveCommands();
    BATON_LOG(INFO, kLog) << "engine " << id << " is the canary";
    return upgrade_->command;
  }
  return active_command();
}

void Coordinator::SetPhase(Upgrade::Phase phase) {
  BATON_LOG(INFO, kLog) << ToString(upgrade_->kind) << ": " << ToString(upgrade_->phase) << " -> "
                        << ToString(phase) << " (engine " << upgrade_->canary << ")";
  upgrade_->phase = phase;
  upgrade_->phase_since = s_.clock.Now();
  upgrade_->deadline.reset();
  SaveCommands();
}

// The canary's share of the pool at `weight` %. The primary keeps a tenth even at 100 %: its
// requests in flight finish there, and the canary's failed attempts are retried there. On a
// device pool the share is whole chunks (the unit engines map), at most those that leave the
// primary its tenth.
uint32_t Coordinator::CanaryTarget(uint32_t weight) const {
  const uint64_t blocks = s_.config.block_count;
  const uint64_t most = blocks - PrimaryKeeps();
  uint64_t share = std::min(blocks * weight / 100, most);
  const uint64_t chunk = s_.ledger->blocks_per_chunk();
  if (chunk > 1)
    share = std::min<uint64_t>(s_.WholeChunks(static_cast<uint32_t>(share)), most / chunk * chunk);
  return std::max<uint32_t>(1, static_cast<uint32_t>(share));
}

uint32_t Coordinator::PrimaryKeeps() const {
  return std::max<uint32_t>(1, s_.config.block_count / 10);
}

void Coordinator::ReclaimFromPrimary(uint32_t weight) {
  EngineRecord* p = s_.Find(s_.primary);
  const LedgerEngine* c = s_.ledger->engine(upgrade_->canary);
  const uint32_t held = c != nullptr && c->role == LedgerRole::kHolder ? c->blocks : 0;
  const uint32_t target = CanaryTarget(weight);
  const uint32_t free = s_.ledger->GrantableTo(upgrade_->canary);
  const LedgerEngine* pl = p != nullptr ? s_.ledger->engine(p->id) : nullptr;
  if (p == nullptr || !p->connected || pl == nullptr || held + free >= target) return;
  // One at a time: two answers to the same holdings could give away what the primary keeps.
  const bool pending = s_.reclaim.from == p->id;
  if (pending && s_.clock.Now() < s_.reclaim.sent + CoordinatorState::kReclaimAnswerTimeout) return;
  const uint32_t asked = pending ? s_.reclaim.blocks : 0;
  // Whole chunks, and never into what the primary keeps (a short last chunk included).
  const uint32_t chunk = s_.ledger->blocks_per_chunk();
  const uint32_t keep = PrimaryKeeps() + asked;
  const uint32_t spare = pl->blocks > keep ? pl->blocks - keep : 0;
  const uint32_t want = std::min(s_.WholeChunks(target - held - free), spare / chunk * chunk);
  if (want == 0) return;
  BATON_LOG(INFO, kLog) << "asking engine " << p->id << " (the primary) to return " << want
                        << " blocks for the canary's " << weight << " % step";
  if (!SendOrFail(*p, proto::Reclaim{.epoch = pl->epoch, .blocks = want})) return;
  s_.reclaim = PendingReclaim{.from = p->id, .blocks = asked + want, .sent = s_.clock.Now()};
}

void Coordinator::StartCanary(EngineRecord& e) {
  if (s_.stopping || !e.is(EngineState::kStandby)) return;  // a failover promoted it instead
  SetPhase(Upgrade::Phase::kReclaiming);
  upgrade_->deadline = s_.clock.Now() + kReclaimTimeout;
  ReclaimFromPrimary(upgrade_->policy.steps.front());
  if (upgrade_.has_value() &&
      s_.ledger->GrantableTo(upgrade_->canary) >= CanaryTarget(upgrade_->policy.steps.front())) {
    PromoteCanary();
  }
}

void Coordinator::OnPrimaryReturned() {
  const bool answers_reclaim = s_.reclaim.from == s_.primary;
  // The answer to RefillReserve's Reclaim: the reserve keeps what came back, the rest stays free.
  const bool for_reserve = answers_reclaim && s_.reclaim.for_reserve;
  if (answers_reclaim) s_.reclaim = PendingReclaim{};
  if (s_.stopping || for_reserve) return;
  if (!upgrade_.has_value()) {
    // The answer to a Reclaim came after the upgrade ended: nobody else wants the blocks.
    if (answers_reclaim) {
      give_back_blocks_ = true;
      GiveFreeBlocksToPrimary();
    }
    return;
  }
  if (upgrade_->phase == Upgrade::Phase::kReclaiming) {
    PromoteCanary();  // may end the upgrade
  } else if (upgrade_->phase == Upgrade::Phase::kCanary) {
    GrantFreeToCanary();
  }
  // Blocks it returned of chunks it keeps can go to no other engine: they go back (only for
  // an answer to a Reclaim: blocks an engine gives up of its own accord stay free).
  EngineRecord* p = s_.Find(s_.primary);
  const uint32_t kept = answers_reclaim ? s_.ledger->FreeBesideHeld(s_.primary) : 0;
  if (p != nullptr && p->serving() && kept > 0) {
    GrantFree(*p, kept, "the primary (its own chunks)");
  }
}

void Coordinator::PromoteCanary() {
  EngineRecord* c = s_.Find(upgrade_->canary);
  if (s_.stopping || c == nullptr || !c->live() || !c->is(EngineState::kStandby)) return;
  Result<uint64_t> epoch = s_.AdvanceEpoch();
  if (!epoch.ok()) return RollBackCanary("no durable epoch: " + epoch.status().message());
  if (Status promoted = s_.ledger->Promote(c->id, *epoch); !promoted.ok()) {
    return RollBackCanary("promoting the canary: " + promoted.message());
  }
  const uint32_t free = s_.ledger->GrantableTo(c->id);
  const uint32_t want = std::min(free, CanaryTarget(upgrade_->policy.steps.front()));
  std::vector<Extent> extents;
  if (want > 0) {
    Result<std::vector<Extent>> granted = s_.ledger->Grant(c->id, want, *epoch);
    if (granted.ok()) extents = std::move(granted).value();
  }
  SetPhase(Upgrade::Phase::kPromoting);
  BATON_FAILPOINT("canary_promoting");  // the canary's blocks granted, its Promote not sent
  SendPromote(*c, *epoch, extents);
}

void Coordinator::OnCanaryPromoted(EngineRecord& e, uint64_t epoch) {
  s_.Step(e.machine, EngineEvent::kPromoteDone);
  s_.promoting = kNoEngine;
  e.deadline.reset();
  SaveRoster();
  if (s_.primary == kNoEngine) {  // the primary failed while the canary was promoted
    s_.primary = e.id;
    s_.StepPairIfAllowed(PairEvent::kPromoteDone);
    give_back_blocks_ = true;
    EndUpgrade(UpgradeOutcome::kPromoted,
               "the primary failed while the canary was promoted; it serves alone");
    SaveRoster();
    PublishRoutes();
    if (PromotionRecord* r = s_.timelines.current()) {
      r->new_engine = e.id;
      r->promote_acked = r->route_published = s_.clock.Now();
      s_.timelines.Close("serving: the canary took over");
    }
    s_.relaunch_not_before = s_.clock.Now() + s_.config.standby_relaunch_delay;
    MaybeLaunch();
    return;
  }
  SetPhase(Upgrade::Phase::kCanary);
  upgrade_->judge.emplace(s_.clock, upgrade_->policy, s_.primary, e.id,
                          s_.effects.RouterOutcomes());
  SaveCommands();                       // with the first step's weight
  BATON_FAILPOINT("mid_upgrade_step");  // the step recorded, the canary's blocks not moved
  BATON_LOG(INFO, kLog) << "engine " << e.id << " (version " << e.version
                        << ") serves as the canary at epoch " << epoch << ": "
                        << upgrade_->judge->weight() << " % of new requests";
  PublishRoutes();
}

void Coordinator::TickUpgrade() {
  if (!upgrade_.has_value() || s_.stopping || recovery_.has_value()) return;
  EngineRecord* c = s_.Find(upgrade_->canary);
  const EngineRecord* p = s_.Find(s_.primary);
  const bool primary_serves = p != nullptr && p->serving();
  if (upgrade_->phase == Upgrade::Phase::kLaunching && c != nullptr && c->live() &&
      c->is(EngineState::kStandby) && primary_serves) {
    return StartCanary(*c);  // it became ready while the primary could not lend it blocks
  }
  if (upgrade_->phase == Upgrade::Phase::kReclaiming && upgrade_->deadline.has_value() &&
      s_.clock.Now() >= *upgrade_->deadline && c != nullptr && c->is(EngineState::kStandby)) {
    BATON_LOG(WARN, kLog) << "the primary did not return blocks in time; the canary starts with "
                          << s_.ledger->GrantableTo(upgrade_->canary) << " free blocks";
    return PromoteCanary();
  }
  if (upgrade_->phase == Upgrade::Phase::kCanary) TickCanary();
}

void Coordinator::TickCanary() {
  GrantFreeToCanary();
  if (s_.clock.Now() >= upgrade_->next_reclaim) {  // the primary may have freed blocks since
    upgrade_->next_reclaim = s_.clock.Now() + kReclaimTimeout;
    ReclaimFromPrimary(upgrade_->judge->weight());
    if (!upgrade_.has_value()) return;  // the primary failed: the canary took over
  }
  const OutcomeMap now = s_.effects.RouterOutcomes();
  const CanaryJudge::Judgement j = upgrade_->judge->Judge(now);
  upgrade_->judgement = j.reason;
  if (j.verdict == CanaryJudge::Verdict::kHold && s_.effects.RouterCount() == 0) {
    upgrade_->judgement += " (no router is subscribed: nothing is seen, so nothing is judged)";
  }
  switch (j.verdict) {
    case CanaryJudge::Verdict::kHold:
      return;
    case CanaryJudge::Verdict::kRollback:
      return RollBackCanary(j.reason);
    case CanaryJudge::Verdict::kPromote:
      return FinishUpgrade();
    case CanaryJudge::Verdict::kAdvance:
      upgrade_->judge->Advance(now);
      SaveCommands();
      BATON_FAILPOINT("mid_upgrade_step");  // the step recorded, the canary's blocks not moved
      BATON_LOG(INFO, kLog) << "canary engine " << upgrade_->canary << " passed its step: now "
                            << upgrade_->judge->weight() << " % of new requests";
      upgrade_->next_reclaim = s_.clock.Now() + kReclaimTimeout;
      ReclaimFromPrimary(upgrade_->judge->weight());
      if (!upgrade_.has_value()) return;  // the primary failed: the canary took over
      GrantFreeToCanary();
      PublishRoutes();
      return;
  }
}

void Coordinator::GrantFreeToCanary() {
  EngineRecord* c = s_.Find(upgrade_->canary);
  const LedgerEngine* le = s_.ledger->engine(upgrade_->canary);
  if (c == nullptr || !c->serving() || le == nullptr || le->role != LedgerRole::kHolder) return;
  const uint32_t target = CanaryTarget(upgrade_->judge->weight());
  const uint32_t free = s_.ledger->GrantableTo(c->id);
  const uint32_t want = std::min(free, target > le->blocks ? target - le->blocks : 0);
  if (want > 0) GrantFree(*c, want, "the canary");
}

void Coordinator::FinishUpgrade() {
  EngineRecord* p = s_.Find(s_.primary);
  if (p == nullptr || !p->serving() || !s_.pair.Allows(PairEvent::kGracefulPromoteRequested)) {
    upgrade_->judgement = "waiting for the pair to settle before the canary takes over";
    return;
  }
  if (!CheckNoCalledOffDrain(*p).ok()) return;
  SetPhase(Upgrade::Phase::kFinishing);
  s_.StepPair(PairEvent::kGracefulPromoteRequested);
  OpenPlannedTimeline(PromotionKind::kUpgrade, "canary passed every step", *p, upgrade_->canary);
  BATON_LOG(INFO, kLog) << "canary engine " << upgrade_->canary
                        << " passed every step: draining engine " << p->id
                        << ", the old primary; the canary takes over";
  DrainEngine(*p);
  PublishRoutes();
}

void Coordinator::RollBackCanary(const std::string& reason) {
  upgrade_->rollback_reason = reason;
  EngineRecord* c = s_.Find(upgrade_->canary);
  BATON_LOG(WARN, kLog) << "rolling back canary engine " << upgrade_->canary << ": " << reason;
  if (c == nullptr || !c->live()) return EndUpgrade(UpgradeOutcome::kRolledBack, reason);
  if (!c->serving()) return Fail(c->id, FailCause::kShutdown, "rolled back: " + reason);
  SetPhase(Upgrade::Phase::kRollingBack);
  DrainEngine(*c);
  PublishRoutes();
}

void Coordinator::OnCanaryGone(EngineRecord& e) {
  const std::string why =
      !upgrade_->rollback_reason.empty()
          ? upgrade_->rollback_reason
          : "the canary failed: " + std::string(ToString(*e.fail_cause)) + ": " + e.fail_reason;
  give_back_blocks_ = true;
  EndUpgrade(UpgradeOutcome::kRolledBack, why);
}

bool Coordinator::CanaryTakesOver(EngineRecord& old) {
  if (!upgrade_.has_value()) return false;
  EngineRecord* c = s_.Find(upgrade_->canary);
  if (c == nullptr || !c->live()) return false;
  (void)ResumeEngine(*c);  // a rollback in progress is called off
  if (!c->serving()) return false;
  s_.primary = c->id;
  s_.StepPairIfAllowed(PairEvent::kPromoteDone);
  give_back_blocks_ = true;
  const bool planned = upgrade_->phase == Upgrade::Phase::kFinishing;
  if (PromotionRecord* r = s_.timelines.current()) {
    r->new_engine = c->id;
    r->promote_acked = s_.clock.Now();
  }
  BATON_LOG(INFO, kLog) << "engine " << c->id << " (the canary) is the primary; engine " << old.id
                        << " is " << (planned ? "drained" : "lost: " + old.fail_reason);
  EndUpgrade(
      UpgradeOutcome::kPromoted,
      planned ? "passed every step" : "the primary failed during the canary: " + old.fail_reason);
  SaveRoster();
  PublishRoutes();
  if (PromotionRecord* r = s_.timelines.current()) {
    r->route_published = s_.clock.Now();
    s_.timelines.Close("serving");
  }
  s_.relaunch_not_before = s_.clock.Now() + s_.config.standby_relaunch_delay;
  return true;
}

void Coordinator::EndUpgrade(UpgradeOutcome outcome, const std::string& reason) {
  UpgradeResult res{.kind = upgrade_->kind,
                    .outcome = outcome,
                    .reason = reason,
                    .canary = upgrade_->canary,
                    .version = "",
                    .last_weight = upgrade_->judge.has_value() ? upgrade_->judge->weight() : 0,
                    .started = upgrade_->started,
                    .ended = s_.clock.Now()};
  if (const EngineRecord* c = s_.Find(upgrade_->canary)) res.version = c->version;
  if (outcome == UpgradeOutcome::kPromoted) {
    previous_command_ = upgrade_->previous;
    active_command_ = upgrade_->command;
    ++upgrades_promoted_;
  } else {
    ++upgrades_rolled_back_;
  }
  BATON_LOG(INFO, kLog) << ToString(upgrade_->kind) << " " << ToString(outcome) << " (engine "
                        << res.canary << "): " << reason
                        << "; standbys now run: " << Joined(active_command());
  upgrade_history_.push_back(std::move(res));
  if (upgrade_history_.size() > kKeepUpgrades) upgrade_history_.pop_front();
  upgrade_.reset();
  SetUpReserve(/*announce=*/false);  // back, and refilled from the primary (RefillReserve)
  SaveCommands();
}

// While a canary runs beside the primary there is no standby to promote (a failing primary
// is replaced by the canary, which holds blocks of its own): the reserve's blocks are part of
// what the canary's share is counted from.
void Coordinator::LendReserveToCanary() {
  if (s_.ledger->promotion_reserve() == 0) return;
  BATON_LOG(INFO, kLog) << "the promotion reserve's " << s_.ledger->promotion_reserve()
                        << " blocks are lent to the upgrade until it ends";
  (void)s_.ledger->SetPromotionReserve(0);
}

void Coordinator::GiveFreeBlocksToPrimary() {
  if (!give_back_blocks_ || upgrade_.has_value() || s_.config.initial_grant_blocks != 0) return;
  EngineRecord* p = s_.Find(s_.primary);
  const LedgerEngine* le = s_.ledger->engine(s_.primary);
  if (p == nullptr || !p->serving() || !p->connected || le == nullptr ||
      le->role != LedgerRole::kHolder || BlocksAwaitBarrier()) {
    return;
  }
  give_back_blocks_ = false;
  const uint32_t free = s_.ledger->GrantableTo(p->id);
  if (free > 0) GrantFree(*p, free, "the primary");
}

void Coordinator::RetireStaleStandbys() {
  if (upgrade_.has_value() || s_.stopping || recovery_.has_value()) return;
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
    Fail(id, FailCause::kShutdown, "runs the engine command an upgrade replaced");
  }
}

}  // namespace baton
