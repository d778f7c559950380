// RecoveryPart: the old primary's blocks owed to an engine promoted before that primary's
// barrier, when the controller that promoted it is gone before the barrier passed. That
// controller would have granted them to it after the barrier (FailoverPart::GrantToPromoted);
// its successor re-adopts the engine as promoted and grants them once the engine that may
// still map them (the roster's fenced holder of them) is gone and past its barrier, so that
// the engine, waiting for them, adopts their KV in place instead of waiting out its limit.
#include <algorithm>

#include "base/log.h"
#include "controller/core/coordinator_parts.h"

namespace baton {

namespace {

constexpr const char* kLog = "controller";

}  // namespace

void RecoveryPart::NoteInheritance(const EngineRecord& e, const proto::Reattach& msg) {
  const Roster& roster = own_.recovery->roster;
  const RosterEngine* r = roster.Find(e.id);
  const bool canary = own_.recovery->upgrade.has_value() && own_.recovery->upgrade->canary == e.id;
  // A failover's promotion only: a canary's takes no fenced engine's blocks.
  if (r == nullptr || r->role != RosterRole::kPromoting || roster.primary != kNoEngine || canary) {
    return;
  }
  Recovery::Inheritance owed{.heir = e.id, .epoch = msg.epoch, .from = {}};
  // The old primary: the fenced holder of the highest epoch below the promotion's (the
  // Promote's epoch is the one its fence reserved).
  const RosterEngine* old = nullptr;
  for (const RosterEngine& o : roster.engines) {
    if (o.role != RosterRole::kFencing || o.epoch == 0 || o.epoch >= msg.epoch) continue;
    if (o.extents.empty() || (old != nullptr && old->epoch >= o.epoch)) continue;
    old = &o;
  }
  if (old != nullptr) owed.from[old->id] = old->extents;
  // What the roster gives it beyond what it claims: written before a Grant it never received
  // (its old holder was past the barrier then).
  owed.from[e.id] = r->extents;
  if (old != nullptr) {
    BATON_LOG(INFO, kLog) << "engine " << e.id << " was promoted before engine " << old->id
                          << "'s barrier: its " << BlocksIn(old->extents)
                          << " blocks follow once it is past that barrier";
  }
  own_.recovery->inheritance = std::move(owed);
  GrantInheritance();
}

void RecoveryPart::GrantInheritance() {
  if (!own_.recovery->inheritance.has_value()) return;
  Recovery::Inheritance& owed = *own_.recovery->inheritance;
  EngineRecord* heir = s_.Find(owed.heir);
  const LedgerEngine* hl = s_.ledger->engine(owed.heir);
  if (heir == nullptr || !heir->live() || hl == nullptr || hl->role != LedgerRole::kHolder ||
      hl->epoch != owed.epoch) {
    own_.recovery->inheritance.reset();  // what it was owed is freed at the recovery's end
    return;
  }
  const FailoverFields& failover = p_.failover->own();
  for (auto it = owed.from.begin(); it != owed.from.end() && heir->live();) {
    const EngineId holder = it->first;
    const bool past_barrier =
        holder == owed.heir ||
        (s_.Find(holder) == nullptr && own_.recovery->gone.count(holder) == 0 &&
         own_.recovery->awaited.count(holder) == 0 && failover.barrier_waits.count(holder) == 0 &&
         failover.unfenced_reaped.count(holder) == 0);
    if (!past_barrier) {
      ++it;
      continue;
    }
    // Only the old primary's blocks are the ones it waits for (its own, a Grant it missed,
    // are not): none of those granted, it is told none will come.
    const bool granted = GrantOwed(*heir, it->second);
    if (holder != owed.heir) owed.granted |= granted;
    it = owed.from.erase(it);
  }
  if (!owed.from.empty()) return;
  const bool none_came = !owed.granted;
  const uint64_t epoch = owed.epoch;
  own_.recovery->inheritance.reset();
  if (!none_came || heir->protocol < proto::kProtocolVersionQuarantine) return;
  BATON_LOG(WARN, kLog) << "engine " << heir->id << " is owed no block of the old primary it "
                        << "was promoted before (the roster does not account for them): told "
                        << "not to wait for them";
  p_.engines->SendOrFail(
      *heir, proto::Quarantined{
                 .epoch = epoch, .extents = {}, .barrier_estimate_us = 0, .wait_limit_ms = 0});
}

bool RecoveryPart::GrantOwed(EngineRecord& heir, const std::vector<Extent>& ready) {
  Result<std::vector<Extent>> moved = s_.ledger->GrantUnclaimed(heir.id, ready);
  if (!moved.ok()) {
    BATON_LOG(ERROR, kLog) << "the blocks owed to engine " << heir.id
                           << " are not granted: " << moved.status().ToString();
    return false;
  }
  if (moved->empty()) return false;
  const uint64_t epoch = s_.ledger->engine(heir.id)->epoch;
  p_.engines->SaveRoster();  // before the engine can map them
  BATON_LOG(INFO, kLog) << BlocksIn(*moved) << " blocks of the previous controller's failover, "
                        << "past their barrier, granted to engine " << heir.id << " at epoch "
                        << epoch;
  return p_.engines->SendOrFail(heir, proto::Grant{.epoch = epoch, .extents = ToRanges(*moved)});
}

}  // namespace baton
