// Coordinator: a restarted controller re-adopts the engines and blocks it can account for.
//
// At Start with a roster, every engine it lists is a record in `adopting`. An engine whose
// process is gone, or that maps memory this controller could not adopt, or that was being
// fenced, is fenced at once. The others have `readopt_timeout` to reattach (Reattach); each
// reattachment is checked against the roster (token, by Admit; role, epoch, extents, the
// memory it maps) and either re-adopted as it was or fenced. The ledger starts with every
// block quarantined to the previous controller; a re-adopted holder takes back its blocks,
// and the rest are freed once every engine not re-adopted has exited and passed its barrier
// (recovery ends). Until then nothing is promoted or launched, so no block moves before the
// engines that could still write it are gone.
#include <algorithm>

#include "base/failpoint.h"
#include "base/log.h"
#include "controller/core/coordinator.h"

namespace baton {
namespace {

constexpr const char* kLog = "controller";

// The roster roles a previous controller may have written for an engine that now says
// `claimed` (it may not have seen the last message the controller sent or received).
bool RoleFits(proto::ReattachRole claimed, RosterRole roster) {
  switch (claimed) {
    case proto::ReattachRole::kStandby:
      return roster == RosterRole::kLaunching || roster == RosterRole::kStandby ||
             roster == RosterRole::kPromoting;
    case proto::ReattachRole::kPromoted:
      return roster == RosterRole::kPromoting;
    case proto::ReattachRole::kServing:
      return roster == RosterRole::kPromoting || roster == RosterRole::kServing ||
             roster == RosterRole::kDraining;
    case proto::ReattachRole::kDraining:
    case proto::ReattachRole::kDrained:
      return roster == RosterRole::kServing || roster == RosterRole::kDraining;
  }
  return false;
}

// Whether `r`, promoted by the previous controller in a failover (no primary in its roster)
// and not as a canary, may say it serves: its PromoteAck was lost with that controller.
bool PromotedToPrimary(const RosterEngine& r, const Roster& roster, bool canary) {
  return r.role == RosterRole::kPromoting && roster.primary == kNoEngine && !canary;
}

// Whether every extent of `claimed` lies inside `held`, and none overlaps another.
bool Within(std::vector<Extent> claimed, const std::vector<Extent>& held) {
  std::sort(claimed.begin(), claimed.end(),
            [](const Extent& a, const Extent& b) { return a.first < b.first; });
  for (size_t i = 0; i < claimed.size(); ++i) {
    const Extent& c = claimed[i];
    if (c.count == 0 || (i > 0 && claimed[i - 1].end() > c.first)) return false;
    for (uint32_t b = c.first; b < c.end(); ++b) {
      const bool in = std::any_of(held.begin(), held.end(),
                                  [b](const Extent& h) { return b >= h.first && b < h.end(); });
      if (!in) return false;
    }
  }
  return true;
}

}  // namespace

void Coordinator::BeginRecovery(const StartState& found) {
  const Roster& roster = *found.roster;
  s_.next_engine_id = roster.next_engine_id;
  const TimePoint now = s_.clock.Now();
  if (found.memory_adopted) {
    s_.ledger =
        std::make_unique<PoolLedger>(PoolLedger::Recovering(s_.config.block_count, s_.epochs));
    if (found.blocks_per_chunk > 1) (void)s_.ledger->SetBlocksPerChunk(found.blocks_per_chunk);
    s_.ledger->SetMutationForTesting(s_.ledger_mutation);
    SetUpReserve(/*announce=*/false);  // the new ledger's, as the start's
  }
  s_.pair = NewPairMachine("pair", s_.clock, /*recovering=*/true);
  recovery_ = Recovery{.deadline = now + s_.config.readopt_timeout,
                       .exec_at = found.exec_at,
                       .roster = roster,
                       .arena_dev = found.arena_dev,
                       .arena_ino = found.arena_ino,
                       .pool_dev = found.pool_dev,
                       .pool_ino = found.pool_ino,
                       .awaited = {},
                       .gone = {},
                       .upgrade = std::nullopt,
                       .status = {}};
  RecoveryStatus& st = recovery_->status;
  st.restarted = true;
  st.in_progress = true;
  st.roster = "adopted";
  st.memory = found.memory_adopted ? "adopted" : found.memory_reason;
  if (found.commands.has_value()) recovery_->upgrade = found.commands->in_flight;
  BATON_LOG(INFO, kLog) << "controller restart (incarnation " << s_.incarnation
                        << "): " << roster.engines.size() << " engines of the previous controller; "
                        << "weights and pool: " << st.memory << "; waiting "
                        << MillisBetween(now, recovery_->deadline)
                        << " ms for them to register again";
  for (const RosterEngine& r : roster.engines) {
    auto alive = found.alive.find(r.id);
    AdoptRosterEngine(r, alive != found.alive.end() && alive->second, found);
  }
  SaveRoster();
  TickRecovery();
}

void Coordinator::AdoptRosterEngine(const RosterEngine& r, bool alive, const StartState& found) {
  auto rec = std::make_unique<EngineRecord>(r.id, s_.clock, /*adopted_from_previous=*/true);
  rec->launch_role = r.launch_role;
  rec->token = r.token;
  rec->port = r.port;
  rec->pid = r.pid;
  rec->command = r.command;
  rec->version = r.version;
  rec->http_address = r.http_address;
  rec->launched_at = s_.clock.Now();
  EngineRecord& e = *rec;
  s_.engines[r.id] = std::move(rec);
  if (!alive) {
    e.fail_cause = FailCause::kDied;
    e.fail_reason = "exited while no controller ran";
    s_.Step(e.machine, EngineEvent::kDied);
    (void)s_.effects.Kill(e.id);  // what it started (its group, its cgroup) goes with it
    BATON_LOG(WARN, kLog) << "engine " << e.id << " (pid " << e.pid << ", " << ToString(r.role)
                          << ") exited while no controller ran";
    s_.RecordExit(e, "died: exited while no controller ran",
                  "unknown (not this controller's child)");
    NoteGone(e, "exited while no controller ran");
    return;
  }
  if (!found.memory_adopted) {
    return FenceUnaccounted(e,
                            "it maps the previous controller's weights and pool, which were "
                            "not adopted: " +
                                found.memory_reason);
  }
  if (r.role == RosterRole::kFencing) {
    return FenceUnaccounted(e, "the previous controller was fencing it");
  }
  recovery_->awaited.insert(e.id);
}

void Coordinator::FenceUnaccounted(EngineRecord& e, const std::string& why) {
  if (recovery_.has_value()) {
    recovery_->status.fenced.push_back(RecoveryStatus::Fenced{e.id, why});
    if (e.id == recovery_->roster.primary && s_.primary == kNoEngine) {
      s_.timelines.Open(PromotionKind::kFailover, "the previous primary is unaccounted for: " + why)
          .old_engine = e.id;
      s_.StepPairIfAllowed(PairEvent::kPrimaryDied);
    }
  }
  Fail(e.id, FailCause::kUnaccounted, why);
}

void Coordinator::NoteGone(EngineRecord& e, const std::string& how) {
  if (!recovery_.has_value()) return;
  recovery_->awaited.erase(e.id);
  recovery_->gone[e.id] = s_.clock.Now() + s_.config.gpu_release_timeout;
  if (e.id == recovery_->roster.primary && s_.primary == kNoEngine &&
      s_.pair.state() == PairState::kRecovering) {
    PromotionRecord& r = s_.timelines.Open(PromotionKind::kFailover, "the previous primary " + how);
    r.old_engine = e.id;
    r.old_pid = e.pid;
    r.detected = s_.clock.Now();
    s_.StepPair(PairEvent::kPrimaryDied);
  }
  s_.engines.erase(e.id);
}

void Coordinator::OnReattach(EngineRecord& e, const proto::Reattach& msg) {
  if (!e.adopted || !e.is(EngineState::kAdopting) || !recovery_.has_value()) {
    return StopAndFence(e, FailCause::kMisbehaved,
                        "Reattach from an engine this controller launched or already adopted");
  }
  if (const std::string why = CheckReattach(e, msg); !why.empty()) {
    recovery_->status.fenced.push_back(RecoveryStatus::Fenced{e.id, why});
    return StopAndFence(e, FailCause::kUnaccounted, "reattach refused: " + why);
  }
  Readopt(e, msg);
}

std::string Coordinator::CheckReattach(const EngineRecord& e, const proto::Reattach& msg) const {
  const RosterEngine* r = recovery_->roster.Find(e.id);
  if (r == nullptr) return "it is not in the roster";
  if (msg.engine_id != e.id) {
    return "it names engine " + std::to_string(msg.engine_id) + " but its token is engine " +
           std::to_string(e.id) + "'s";
  }
  if (Status fields = CheckEngineFields(msg.engine_version, msg.http_address, "Reattach");
      !fields.ok()) {
    return fields.message();
  }
  if (msg.role > static_cast<uint8_t>(proto::ReattachRole::kDrained)) {
    return "unknown role " + std::to_string(msg.role);
  }
  if (msg.arena_ino != recovery_->arena_ino || msg.arena_dev != recovery_->arena_dev ||
      msg.pool_ino != recovery_->pool_ino || msg.pool_dev != recovery_->pool_dev) {
    return "it maps other memory than this controller's weights and pool";
  }
  const auto role = static_cast<proto::ReattachRole>(msg.role);
  if (!RoleFits(role, r->role)) {
    return std::string("it says it is ") + proto::ToString(role) + " but the roster has it " +
           ToString(r->role);
  }
  const std::vector<Extent> claimed = ToExtents(msg.extents);
  if (role == proto::ReattachRole::kStandby) {
    if (msg.epoch != 0 || !claimed.empty()) return "a standby that claims an epoch or blocks";
    return "";
  }
  if (msg.epoch == 0 || msg.epoch != r->epoch) {
    return "it claims epoch " + std::to_string(msg.epoch) + ", the roster " +
           std::to_string(r->epoch);
  }
  if (msg.epoch > s_.epochs.current()) {
    return "epoch " + std::to_string(msg.epoch) + " is above the journal's " +
           std::to_string(s_.epochs.current());
  }
  if (!Within(claimed, r->extents)) {
    return "it claims blocks the roster does not give it";
  }
  const bool canary = recovery_->upgrade.has_value() && recovery_->upgrade->canary == e.id;
  if (role == proto::ReattachRole::kServing && e.id != recovery_->roster.primary && !canary &&
      !PromotedToPrimary(*r, recovery_->roster, canary)) {
    return "it says it serves but the roster's primary is engine " +
           std::to_string(recovery_->roster.primary);
  }
  return "";
}

void Coordinator::Readopt(EngineRecord& e, const proto::Reattach& msg) {
  const auto role = static_cast<proto::ReattachRole>(msg.role);
  const std::vector<Extent> claimed = ToExtents(msg.extents);
  const RosterEngine* r = recovery_->roster.Find(e.id);
  const bool promoted_to_primary =
      r != nullptr &&
      PromotedToPrimary(*r, recovery_->roster,
                        recovery_->upgrade.has_value() && recovery_->upgrade->canary == e.id);
  const Status added = role == proto::ReattachRole::kStandby
                           ? s_.ledger->AddStandby(e.id)
                           : s_.ledger->Readopt(e.id, msg.epoch, claimed);
  if (!added.ok()) {
    recovery_->status.fenced.push_back(RecoveryStatus::Fenced{e.id, added.message()});
    return StopAndFence(e, FailCause::kUnaccounted, "reattach refused: " + added.message());
  }
  e.version = msg.engine_version;
  e.http_address = msg.http_address;
  if (!SendOrFail(e, proto::ReattachAck{.engine_id = e.id,
                                        .heartbeat_interval_ms = static_cast<uint32_t>(
                                            std::chrono::duration_cast<std::chrono::milliseconds>(
                                                s_.config.heartbeat_interval)
                                                .count())})) {
    return;
  }
  StartDetector(e);
  recovery_->awaited.erase(e.id);
  recovery_->status.readopted.push_back(e.id);
  BATON_LOG(INFO, kLog) << "engine " << e.id << " (pid " << e.pid << ") re-adopted as "
                        << proto::ToString(role) << (msg.epoch != 0 ? " at epoch " : "")
                        << (msg.epoch != 0 ? std::to_string(msg.epoch) : std::string()) << " with "
                        << BlocksIn(claimed) << " blocks";
  switch (role) {
    case proto::ReattachRole::kStandby:
      s_.Step(e.machine, EngineEvent::kReadoptedStandby);
      e.ready_at = s_.clock.Now();
      s_.StepPairIfAllowed(PairEvent::kStandbyReady);
      break;
    case proto::ReattachRole::kPromoted:
      s_.Step(e.machine, EngineEvent::kReadoptedPromoting);
      s_.promoting = e.id;  // its PromoteAck follows once it serves
      e.deadline = s_.clock.Now() + s_.config.promote_timeout;
      break;
    case proto::ReattachRole::kServing:
    case proto::ReattachRole::kDraining:
    case proto::ReattachRole::kDrained:
      s_.Step(e.machine, role == proto::ReattachRole::kServing ? EngineEvent::kReadoptedServing
                                                               : EngineEvent::kReadoptedDraining);
      if (e.id == recovery_->roster.primary || promoted_to_primary) {
        s_.primary = e.id;
        s_.StepPair(PairEvent::kPromoteDone);
        if (s_.Standby() != nullptr) s_.StepPairIfAllowed(PairEvent::kStandbyReady);
      }
      break;
  }
  if (role == proto::ReattachRole::kDrained) {
    Fail(e.id, FailCause::kPlanned, "it had drained when the previous controller went away");
  } else if (role == proto::ReattachRole::kDraining) {
    // A pair drain and an upgrade's drains go on (ResumeUpgrade picks the upgrade up); a
    // switch-over the restart interrupted is called off, or, for an engine that cannot
    // resume, finished: it is retired once drained.
    const std::optional<InFlightUpgrade>& u = recovery_->upgrade;
    const bool upgrade_drain = u.has_value() && (u->phase == "finishing" || u->canary == e.id);
    if (e.id == s_.primary && recovery_->roster.pair_draining)
      s_.StepPairIfAllowed(PairEvent::kDrain);
    const bool goes_on = upgrade_drain || (e.id == s_.primary && recovery_->roster.pair_draining);
    if (goes_on || !ResumeEngine(e)) e.deadline = s_.clock.Now() + s_.config.drain_timeout;
  }
  SaveRoster();
  if (recovery_->awaited.size() + recovery_->gone.size() > 0) {
    BATON_FAILPOINT("mid_recovery");  // one engine re-adopted, another still awaited
  }
  TickRecovery();
  PublishRoutes();
}

void Coordinator::TickRecovery() {
  if (!recovery_.has_value()) return;
  const TimePoint now = s_.clock.Now();
  if (now >= recovery_->deadline) {
    std::vector<EngineId> silent(recovery_->awaited.begin(), recovery_->awaited.end());
    for (EngineId id : silent) {
      EngineRecord* e = s_.Find(id);
      recovery_->awaited.erase(id);
      if (e == nullptr || !e->live()) continue;
      FenceUnaccounted(*e, "it did not register again within controller.readopt_timeout_ms");
    }
  }
  for (auto it = recovery_->gone.begin(); it != recovery_->gone.end();) {
    const std::string held = s_.effects.BarrierHeldBy(it->first);
    if (!held.empty() && now < it->second) {
      ++it;
      continue;
    }
    if (!held.empty()) {
      BATON_LOG(ERROR, kLog) << "barrier: engine " << it->first
                             << " of the previous controller: " << held
                             << " after the release timeout; its blocks move on";
    }
    s_.effects.Release(it->first);
    it = recovery_->gone.erase(it);
  }
  // An engine fenced as unaccounted for still maps what the previous controller gave it
  // (blocks the ledger holds for the previous incarnation) until it exits and is gone.
  const bool unaccounted_alive =
      std::any_of(s_.engines.begin(), s_.engines.end(), [this](const auto& entry) {
        return entry.second->adopted && !entry.second->live() &&
               s_.ledger->engine(entry.first) == nullptr;
      });
  if (recovery_->awaited.empty() && recovery_->gone.empty() && !unaccounted_alive) EndRecovery();
}

void Coordinator::EndRecovery() {
  if (s_.ledger->recovering()) {
    if (Status ended = s_.ledger->EndRecovery(); !ended.ok()) {
      BATON_LOG(ERROR, kLog) << "ending the ledger's recovery: " << ended.ToString();
    }
  }
  RecoveryStatus& st = recovery_->status;
  st.in_progress = false;
  const bool same_pair = s_.primary != kNoEngine && s_.pair.state() == PairState::kReady;
  if (same_pair) st.readopt_ms = MillisBetween(recovery_->exec_at, s_.clock.Now());
  std::optional<InFlightUpgrade> upgrade = recovery_->upgrade;
  const std::string summary = std::to_string(st.readopted.size()) + " engines re-adopted, " +
                              std::to_string(st.fenced.size()) + " fenced";
  last_recovery_ = st;
  recovery_.reset();
  s_.StepPairIfAllowed(PairEvent::kRecoveryDone);
  BATON_LOG(INFO, kLog) << "recovery done: " << summary << "; pair " << ToString(s_.pair.state())
                        << (same_pair ? " with the same engines, " +
                                            std::to_string(
                                                static_cast<int64_t>(*last_recovery_.readopt_ms)) +
                                            " ms after the process started"
                                      : std::string());
  if (upgrade.has_value()) ResumeUpgrade(*upgrade);
  SaveRoster();
  PublishRoutes();
  GiveFreeBlocksToPrimary();
  MaybePromote();
  MaybeLaunch();
  s_.CheckInvariants();
}

// An upgrade in flight when the previous controller went away goes on where its engines
// are: a serving canary resumes its step (the judge starts the step again from what the
// routers report now), a draining side finishes its drain; anything earlier is rolled back.
void Coordinator::ResumeUpgrade(const InFlightUpgrade& u) {
  EngineRecord* c = s_.Find(u.canary);
  EngineRecord* p = s_.Find(s_.primary);
  Upgrade up;
  up.kind = u.kind;
  up.command = u.command;
  up.previous = active_command();
  up.policy = s_.config.canary;
  if (!u.steps.empty()) up.policy.steps = u.steps;
  if (u.step_duration_ms > 0)
    up.policy.step_duration = std::chrono::milliseconds(u.step_duration_ms);
  if (u.min_requests > 0) up.policy.min_requests = u.min_requests;
  up.primary = p != nullptr ? p->id : kNoEngine;
  up.canary = u.canary;
  up.started = up.phase_since = s_.clock.Now();
  const bool canary_holds =
      c != nullptr && c->live() &&
      (c->serving() || c->is(EngineState::kDraining) || c->is(EngineState::kPromoting));
  std::string outcome;
  const std::string interrupted = "the controller restarted during the " +
                                  std::string(ToString(u.kind)) + " (phase " + u.phase + ")";
  if (!canary_holds || p == nullptr || !ValidateCanaryPolicy(up.policy).ok()) {
    outcome = "rolled back: its canary or its primary did not come back";
    if (c != nullptr && c->live()) {
      upgrade_ = std::move(up);
      RollBackCanary(interrupted);
    } else {
      RecordInterruptedUpgrade(u, interrupted + "; its canary did not come back");
    }
  } else if (c->is(EngineState::kPromoting)) {
    up.phase = Upgrade::Phase::kPromoting;
    upgrade_ = std::move(up);
    outcome = "resumed: the canary's promotion";
  } else if (c->is(EngineState::kDraining)) {
    up.phase = Upgrade::Phase::kRollingBack;
    upgrade_ = std::move(up);
    outcome = "resumed: the canary's rollback";
  } else if (p->is(EngineState::kDraining)) {
    up.phase = Upgrade::Phase::kFinishing;
    upgrade_ = std::move(up);
    OpenPlannedTimeline(PromotionKind::kUpgrade, "canary passed every step", *p, u.canary);
    // The canary stands in for the standby, as its StandbyReady did before the restart.
    s_.StepPairIfAllowed(PairEvent::kStandbyReady);
    s_.StepPairIfAllowed(PairEvent::kGracefulPromoteRequested);
    outcome = "resumed: the canary takes over once the old primary drained";
  } else {
    up.phase = Upgrade::Phase::kCanary;
    up.judge.emplace(s_.clock, up.policy, p->id, c->id, s_.effects.RouterOutcomes());
    const OutcomeMap now = s_.effects.RouterOutcomes();
    while (up.judge->weight() < u.weight && !up.judge->last_step()) up.judge->Advance(now);
    upgrade_ = std::move(up);
    s_.StepPairIfAllowed(PairEvent::kStandbyReady);  // the serving canary stands in for the standby
    outcome = "resumed at " + std::to_string(upgrade_->judge->weight()) + " %";
  }
  last_recovery_.upgrade = ToString(u.kind) + (" " + outcome);
  BATON_LOG(INFO, "upgrade") << ToString(u.kind) << " " << outcome << " (engine " << u.canary
                             << ")";
  if (upgrade_.has_value()) LendReserveToCanary();
  SaveCommands();
}

}  // namespace baton
