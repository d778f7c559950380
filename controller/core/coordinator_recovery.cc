// RecoveryPart: a restarted controller re-adopts the engines and blocks it can account for.
//
// At Start with a roster, every engine it lists is a record in `adopting`. An engine whose
// process is gone, or that maps memory this controller could not adopt, or that was being
// fenced, is fenced at once. The others have `readopt_timeout` to reattach (Reattach); each
// reattachment is checked against the roster (token, by Admit; role, epoch, extents, the
// memory it maps) and either re-adopted as it was or fenced. The ledger starts with every
// block quarantined to the previous controller; a re-adopted holder takes back its blocks,
// and the rest are freed once every engine not re-adopted has exited and passed its barrier
// (recovery ends). Until then nothing is launched and no free block is granted, so no block
// moves before the engines that could still write it are gone; a re-adopted primary that
// fails is replaced by the re-adopted standby with its own blocks, past their barrier.
#include <algorithm>

#include "base/bug.h"
#include "base/failpoint.h"
#include "base/log.h"
#include "controller/core/coordinator_parts.h"

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

RecoveryPart::RecoveryPart(CoordinatorState& s, const CoordinatorParts& p) : s_(s), p_(p) {}

void RecoveryPart::BeginRecovery(const StartState& found) {
  const Roster& roster = *found.roster;
  s_.next_engine_id = roster.next_engine_id;
  const TimePoint now = s_.clock.Now();
  if (found.memory_adopted) {
    s_.ledger =
        std::make_unique<PoolLedger>(PoolLedger::Recovering(s_.config.block_count, s_.epochs));
    if (found.blocks_per_chunk > 1) (void)s_.ledger->SetBlocksPerChunk(found.blocks_per_chunk);
    s_.ledger->SetMutationForTesting(s_.ledger_mutation);
    p_.failover->SetUpReserve(/*announce=*/false);  // the new ledger's, as the start's
  }
  s_.pair = NewPairMachine("pair", s_.clock, /*recovering=*/true);
  own_.recovery = Recovery{.deadline = now + s_.config.readopt_timeout,
                           .exec_at = found.exec_at,
                           .roster = roster,
                           .arena_dev = found.arena_dev,
                           .arena_ino = found.arena_ino,
                           .pool_dev = found.pool_dev,
                           .pool_ino = found.pool_ino,
                           .awaited = {},
                           .gone = {},
                           .upgrade = std::nullopt,
                           .inheritance = std::nullopt,
                           .status = {}};
  RecoveryStatus& st = own_.recovery->status;
  st.restarted = true;
  st.in_progress = true;
  st.roster = "adopted";
  st.memory = found.memory_adopted ? "adopted" : found.memory_reason;
  if (found.commands.has_value()) own_.recovery->upgrade = found.commands->in_flight;
  BATON_LOG(INFO, kLog) << "controller restart (incarnation " << s_.incarnation
                        << "): " << roster.engines.size() << " engines of the previous controller; "
                        << "weights and pool: " << st.memory << "; waiting "
                        << MillisBetween(now, own_.recovery->deadline)
                        << " ms for them to register again";
  for (const RosterEngine& r : roster.engines) {
    auto alive = found.alive.find(r.id);
    AdoptRosterEngine(r, alive != found.alive.end() && alive->second, found);
  }
  p_.engines->SaveRoster();
  TickRecovery();
}

void RecoveryPart::AdoptRosterEngine(const RosterEngine& r, bool alive, const StartState& found) {
  auto rec = std::make_unique<EngineRecord>(r.id, s_.clock, /*adopted_from_previous=*/true);
  rec->launch_role = r.launch_role;
  rec->token = r.token;
  rec->port = r.port;
  rec->pid = r.pid;
  rec->command = r.command;
  rec->version = r.version;
  rec->http_address = r.http_address;
  rec->device_memory = r.device_memory;
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
    own_.recovery->status.gone.push_back({e.id, "exited while no controller ran"});
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
  own_.recovery->awaited.insert(e.id);
}

void RecoveryPart::FenceUnaccounted(EngineRecord& e, const std::string& why) {
  if (own_.recovery.has_value()) {
    own_.recovery->status.fenced.push_back(RecoveryStatus::Fenced{e.id, why});
    if (e.id == own_.recovery->roster.primary && s_.primary == kNoEngine) {
      LosePreviousPrimary(e, "the previous primary is unaccounted for: " + why);
    }
  }
  p_.failover->Fence(e.id, FailCause::kUnaccounted, why);
}

void RecoveryPart::NoteGone(EngineRecord& e, const std::string& how) {
  if (!own_.recovery.has_value()) return;
  own_.recovery->awaited.erase(e.id);
  own_.recovery->gone[e.id] = s_.clock.Now() + s_.config.gpu_release_timeout;
  if (e.id == own_.recovery->roster.primary && s_.primary == kNoEngine &&
      s_.pair.state() == PairState::kRecovering) {
    LosePreviousPrimary(e, "the previous primary " + how);
  }
  s_.Forget(e.id);
}

void RecoveryPart::LosePreviousPrimary(const EngineRecord& e, const std::string& why) {
  const bool drained = own_.recovery->roster.pair_draining;
  PromotionRecord& r =
      s_.timelines.Open(drained ? PromotionKind::kDrain : PromotionKind::kFailover, why);
  r.old_engine = e.id;
  r.old_pid = e.pid;
  r.detected = s_.clock.Now();
  s_.StepPairIfAllowed(drained ? PairEvent::kDrained : PairEvent::kPrimaryDied);
}

// Launched by the previous controller but never registered with it: it holds nothing and
// registers as any new engine. Anything else must reattach.
bool RecoveryPart::AcceptRegister(EngineRecord& e) {
  const RosterEngine* r = own_.recovery.has_value() ? own_.recovery->roster.Find(e.id) : nullptr;
  if (!e.is(EngineState::kAdopting) || r == nullptr || r->role != RosterRole::kLaunching) {
    p_.engines->StopAndFence(e, FailCause::kUnaccounted,
                             "Register from an engine of the previous controller that had "
                             "registered already (it must reattach)");
    return false;
  }
  own_.recovery->awaited.erase(e.id);
  own_.recovery->status.readopted.push_back(e.id);
  return true;
}

// A start without a previous controller's engines: what status says of it.
void RecoveryPart::NoteFreshStart(const StartState& found) {
  own_.last.roster = found.roster_refused.empty() ? "none" : found.roster_refused;
  own_.last.memory = found.memory_adopted ? "adopted" : found.memory_reason;
  own_.last.holders_killed = found.holders_killed;
}

void RecoveryPart::OnReattach(EngineRecord& e, const proto::Reattach& msg) {
  if (!e.adopted || !e.is(EngineState::kAdopting) || !own_.recovery.has_value()) {
    return p_.engines->StopAndFence(
        e, FailCause::kMisbehaved,
        "Reattach from an engine this controller launched or already adopted");
  }
  if (const std::string why = CheckReattach(e, msg); !why.empty()) {
    (void)s_.effects.Send(e.id, proto::Stop{.reason = "reattach refused: " + why});
    return FenceUnaccounted(e, "reattach refused: " + why);
  }
  Readopt(e, msg);
}

std::string RecoveryPart::CheckReattach(const EngineRecord& e, const proto::Reattach& msg) const {
  const RosterEngine* r = own_.recovery->roster.Find(e.id);
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
  if (msg.arena_ino != own_.recovery->arena_ino || msg.arena_dev != own_.recovery->arena_dev ||
      msg.pool_ino != own_.recovery->pool_ino || msg.pool_dev != own_.recovery->pool_dev) {
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
  const bool canary = own_.recovery->upgrade.has_value() && own_.recovery->upgrade->canary == e.id;
  if (role == proto::ReattachRole::kServing && e.id != own_.recovery->roster.primary && !canary &&
      !PromotedToPrimary(*r, own_.recovery->roster, canary)) {
    return "it says it serves but the roster's primary is engine " +
           std::to_string(own_.recovery->roster.primary);
  }
  return "";
}

void RecoveryPart::Readopt(EngineRecord& e, const proto::Reattach& msg) {
  const auto role = static_cast<proto::ReattachRole>(msg.role);
  if (!AcknowledgeReattach(e, msg)) return;
  StepReadopted(e, role);
  if (role == proto::ReattachRole::kPromoted) NoteInheritance(e, msg);
  if (role == proto::ReattachRole::kDrained) {
    RetireDrained(e);
  } else if (role == proto::ReattachRole::kDraining) {
    GoOnDraining(e);
  }
  p_.engines->SaveRoster();
  if (own_.recovery->awaited.size() + own_.recovery->gone.size() > 0) {
    BATON_FAILPOINT("mid_recovery");  // one engine re-adopted, another still awaited
  }
  TickRecovery();
  p_.engines->PublishRoutes();
}

bool RecoveryPart::AcknowledgeReattach(EngineRecord& e, const proto::Reattach& msg) {
  const auto role = static_cast<proto::ReattachRole>(msg.role);
  const std::vector<Extent> claimed = ToExtents(msg.extents);
  const Status added = role == proto::ReattachRole::kStandby
                           ? s_.ledger->AddStandby(e.id)
                           : s_.ledger->Readopt(e.id, msg.epoch, claimed);
  if (!added.ok()) {
    own_.recovery->status.fenced.push_back(RecoveryStatus::Fenced{e.id, added.message()});
    p_.engines->StopAndFence(e, FailCause::kUnaccounted, "reattach refused: " + added.message());
    return false;
  }
  e.version = msg.engine_version;
  e.http_address = msg.http_address;
  const auto interval_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(s_.config.heartbeat_interval);
  if (!p_.engines->SendOrFail(e, proto::ReattachAck{.engine_id = e.id,
                                                    .heartbeat_interval_ms = static_cast<uint32_t>(
                                                        interval_ms.count())})) {
    return false;
  }
  p_.engines->StartDetector(e);
  own_.recovery->awaited.erase(e.id);
  own_.recovery->status.readopted.push_back(e.id);
  BATON_LOG(INFO, kLog) << "engine " << e.id << " (pid " << e.pid << ") re-adopted as "
                        << proto::ToString(role) << (msg.epoch != 0 ? " at epoch " : "")
                        << (msg.epoch != 0 ? std::to_string(msg.epoch) : std::string()) << " with "
                        << BlocksIn(claimed) << " blocks";
  return true;
}

void RecoveryPart::StepReadopted(EngineRecord& e, proto::ReattachRole role) {
  switch (role) {
    case proto::ReattachRole::kStandby:
      s_.Step(e.machine, EngineEvent::kReadoptedStandby);
      e.ready_at = s_.clock.Now();
      s_.StepPairIfAllowed(PairEvent::kStandbyReady);
      return;
    case proto::ReattachRole::kPromoted:
      s_.Step(e.machine, EngineEvent::kReadoptedPromoting);
      s_.promoting = e.id;  // its PromoteAck follows once it serves
      e.deadline = s_.clock.Now() + s_.config.promote_timeout;
      return;
    case proto::ReattachRole::kServing:
    case proto::ReattachRole::kDraining:
    case proto::ReattachRole::kDrained:
      break;
  }
  s_.Step(e.machine, role == proto::ReattachRole::kServing ? EngineEvent::kReadoptedServing
                                                           : EngineEvent::kReadoptedDraining);
  const RosterEngine* r = own_.recovery->roster.Find(e.id);
  const bool canary = own_.recovery->upgrade.has_value() && own_.recovery->upgrade->canary == e.id;
  const bool promoted_to_primary =
      r != nullptr && PromotedToPrimary(*r, own_.recovery->roster, canary);
  if (e.id == own_.recovery->roster.primary || promoted_to_primary) {
    s_.primary = e.id;
    s_.StepPair(PairEvent::kPromoteDone);
    if (s_.Standby() != nullptr) s_.StepPairIfAllowed(PairEvent::kStandbyReady);
  }
}

void RecoveryPart::RetireDrained(EngineRecord& e) {
  if (e.id == s_.primary && own_.recovery->roster.pair_draining) {
    s_.StepPairIfAllowed(PairEvent::kDrain);  // the drain's end: the pair stops, no failover
  }
  std::erase(own_.recovery->status.readopted, e.id);  // drained to its end: gone, not re-adopted
  const std::string why = "it had drained when the previous controller went away";
  own_.recovery->status.gone.push_back({e.id, why});
  p_.failover->Fence(e.id, FailCause::kPlanned, why);
}

// A pair drain and an upgrade's drains go on (ResumeUpgrade picks the upgrade up); a
// switch-over the restart interrupted is called off, or, for an engine that cannot resume,
// finished: it is retired once drained.
void RecoveryPart::GoOnDraining(EngineRecord& e) {
  const std::optional<InFlightUpgrade>& u = own_.recovery->upgrade;
  const bool upgrade_drain =
      u.has_value() && (u->phase == UpgradePhase::kFinishing || u->canary == e.id);
  const bool pair_drain = e.id == s_.primary && own_.recovery->roster.pair_draining;
  if (pair_drain) s_.StepPairIfAllowed(PairEvent::kDrain);
  if (upgrade_drain || pair_drain || !p_.commands->ResumeEngine(e)) {
    e.deadline = s_.clock.Now() + s_.config.drain_timeout;
  }
}

void RecoveryPart::TickRecovery() {
  if (!own_.recovery.has_value()) return;
  const TimePoint now = s_.clock.Now();
  if (now >= own_.recovery->deadline) {
    std::vector<EngineId> silent(own_.recovery->awaited.begin(), own_.recovery->awaited.end());
    for (EngineId id : silent) {
      EngineRecord* e = s_.Find(id);
      own_.recovery->awaited.erase(id);
      if (e == nullptr || !e->live()) continue;
      if (s_.mutation == CoordinatorMutation::kSpareSilentEngines) continue;
      FenceUnaccounted(*e, "it did not register again within controller.readopt_timeout_ms");
    }
  }
  for (auto it = own_.recovery->gone.begin(); it != own_.recovery->gone.end();) {
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
    it = own_.recovery->gone.erase(it);
  }
  GrantInheritance();
  // An engine fenced as unaccounted for still maps what the previous controller gave it
  // (blocks the ledger holds for the previous incarnation) until it exits and is gone.
  const bool unaccounted_alive =
      std::any_of(s_.engines.begin(), s_.engines.end(), [this](const auto& entry) {
        return entry.second->adopted && !entry.second->live() &&
               s_.ledger->engine(entry.first) == nullptr;
      });
  if (own_.recovery->awaited.empty() && own_.recovery->gone.empty() && !unaccounted_alive)
    EndRecovery();
}

void RecoveryPart::EndRecovery() {
  if (own_.recovery->inheritance.has_value()) {
    own_.recovery->inheritance->from.clear();  // freed below: the heir is told if none came
    GrantInheritance();
  }
  if (s_.ledger->recovering()) {
    if (Status ended = s_.ledger->EndRecovery(); !ended.ok()) {
      BATON_BUG("ledger") << "ending the ledger's recovery: " << ended.ToString();
    }
    p_.upgrades->FreeBlocksGoToPrimary();  // the unclaimed blocks freed, beside the reserve
  }
  RecoveryStatus& st = own_.recovery->status;
  st.in_progress = false;
  const bool same_pair = s_.primary != kNoEngine && s_.pair.state() == PairState::kReady;
  if (same_pair) st.readopt_ms = MillisBetween(own_.recovery->exec_at, s_.clock.Now());
  std::optional<InFlightUpgrade> upgrade = own_.recovery->upgrade;
  const bool drained = own_.recovery->roster.pair_draining;
  const std::string summary = std::to_string(st.readopted.size()) + " engines re-adopted, " +
                              std::to_string(st.fenced.size()) + " fenced, " +
                              std::to_string(st.gone.size()) + " gone";
  own_.last = st;
  own_.recovery.reset();
  s_.StepPairIfAllowed(PairEvent::kRecoveryDone);
  BATON_LOG(INFO, kLog) << "recovery done: " << summary << "; pair " << ToString(s_.pair.state())
                        << (same_pair
                                ? " with the same engines, " +
                                      std::to_string(static_cast<int64_t>(*own_.last.readopt_ms)) +
                                      " ms after the process started"
                                : std::string());
  if (upgrade.has_value()) own_.last.upgrade = p_.upgrades->ResumeUpgrade(*upgrade);
  if (drained) p_.commands->KeepDrained();
  p_.engines->SaveRoster();
  p_.engines->PublishRoutes();
  p_.upgrades->GiveFreeBlocksToPrimary();
  p_.failover->MaybePromote();
  p_.engines->MaybeLaunch();
  s_.CheckInvariants();
}

}  // namespace baton
