// FailoverPart: the barrier a fenced holder's blocks wait behind before they move on (to the
// engine promoted before it, to the successor with its Promote, or back to free): every
// process of the engine gone, and on the CUDA backend NVML no longer listing any of them
// (docs/architecture.md, "Fencing rules"); and the promotion reserve, refilled once a
// promotion before the barrier used it.
#include <algorithm>
#include <vector>

#include "base/bug.h"
#include "base/failpoint.h"
#include "base/log.h"
#include "controller/core/coordinator_parts.h"

namespace baton {

namespace {

constexpr const char* kLog = "controller";
// Teardowns remembered for the barrier's estimate, and the estimate before there is one.
constexpr size_t kTeardownsKept = 8;
constexpr Duration kTypicalHostTeardown = std::chrono::milliseconds(2);
constexpr Duration kTypicalDeviceTeardown = std::chrono::milliseconds(100);
// The least time between two Reclaims for the reserve.
constexpr Duration kReserveReclaimTimeout = std::chrono::seconds(1);

}  // namespace

void FailoverPart::HandOverBlocks(EngineId id, const std::optional<PendingFailover>& failover) {
  NoteBarrierPassed(id, failover);
  const LedgerEngine* le = s_.ledger->engine(id);
  const bool fenced = le != nullptr && le->role == LedgerRole::kFenced;
  if (failover.has_value() && failover->promoted) {
    if (fenced) GrantToPromoted(id, *failover);
  } else if (failover.has_value()) {
    EngineRecord* s = s_.Find(failover->successor);
    if (s != nullptr && s->live() && s->is(EngineState::kStandby)) {
      Status promoted = s_.ledger->Promote(s->id, failover->epoch);
      Result<std::vector<Extent>> moved = promoted.ok() ? s_.ledger->ReleaseAfterBarrier(id, s->id)
                                                        : Result<std::vector<Extent>>(promoted);
      if (moved.ok()) {
        SendPromote(*s, failover->epoch, *moved);
      } else {
        BATON_BUG("ledger") << "handing blocks to engine " << s->id << ": "
                            << moved.status().ToString();
      }
    } else if (fenced) {
      ReleaseToFree(id);
    }
  } else if (fenced) {
    ReleaseToFree(id);
  }
  p_.engines->SaveRoster();
  RefillReserve();
  p_.upgrades->GiveFreeBlocksToPrimary();
}

// A fenced engine's blocks with no successor to take them are freed: the reserve is refilled
// from them first (RefillReserve), the rest goes to the primary (GiveFreeBlocksToPrimary).
void FailoverPart::ReleaseToFree(EngineId id) {
  Result<std::vector<Extent>> freed = s_.ledger->ReleaseAfterBarrier(id);
  if (!freed.ok()) {
    BATON_BUG("ledger") << "releasing engine " << id << ": " << freed.status().ToString();
    return;
  }
  if (!freed->empty()) p_.upgrades->FreeBlocksGoToPrimary();
}

// The engine promoted on the reserve takes the old primary's blocks now that nothing can
// write them any more; the SDK keeps their headers, so an engine that waited for them adopts
// the KV they hold in place. Freed instead if that engine is gone or fenced meanwhile.
void FailoverPart::GrantToPromoted(EngineId id, const PendingFailover& failover) {
  EngineRecord* s = s_.Find(failover.successor);
  const LedgerEngine* sl = s_.ledger->engine(failover.successor);
  const bool holds = s != nullptr && s->live() && sl != nullptr &&
                     sl->role == LedgerRole::kHolder && sl->epoch == failover.epoch;
  Result<std::vector<Extent>> moved = s_.ledger->ReleaseAfterBarrier(id, holds ? s->id : kNoEngine);
  if (!moved.ok()) {
    BATON_BUG("ledger") << "releasing engine " << id << ": " << moved.status().ToString();
    return;
  }
  if (moved->empty()) return;
  if (!holds) return p_.upgrades->FreeBlocksGoToPrimary();
  p_.engines->SaveRoster();  // before the engine can map them
  BATON_LOG(INFO, kLog) << "engine " << id << "'s " << BlocksIn(*moved)
                        << " blocks, past its barrier, granted to engine " << s->id << " at epoch "
                        << failover.epoch;
  p_.engines->SendOrFail(*s, proto::Grant{.epoch = failover.epoch, .extents = ToRanges(*moved)});
}

void FailoverPart::NoteBarrierPassed(EngineId id, const std::optional<PendingFailover>& failover) {
  if (!failover.has_value()) return;
  PromotionRecord* r = s_.timelines.Fenced(id, failover->epoch);
  if (r == nullptr) return;
  r->barrier_passed = s_.clock.Now();
  if (!r->detected.has_value()) return;
  own_.teardowns.push_back(*r->barrier_passed - *r->detected);
  if (own_.teardowns.size() > kTeardownsKept) own_.teardowns.pop_front();
  BATON_LOG(INFO, kLog) << "engine " << id << "'s teardown took "
                        << MillisBetween(*r->detected, *r->barrier_passed)
                        << " ms (detected -> barrier passed)";
}

// The median of the last teardowns, less the time since this failover's detection.
Duration FailoverPart::BarrierEstimate() const {
  Duration typical = s_.cuda_backend ? kTypicalDeviceTeardown : kTypicalHostTeardown;
  if (!own_.teardowns.empty()) {
    std::vector<Duration> sorted(own_.teardowns.begin(), own_.teardowns.end());
    std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
    typical = sorted[sorted.size() / 2];
  }
  const PromotionRecord* r = s_.timelines.last();
  const Duration since =
      r != nullptr && r->detected.has_value() ? s_.clock.Now() - *r->detected : Duration::zero();
  return std::max(Duration::zero(), typical - since);
}

// While the reserve is short (a promotion took it and the blocks that came back past the
// barrier went to the new primary), the primary is asked for free blocks, whole chunks, one
// Reclaim at a time; GiveFreeBlocksToPrimary leaves the reserve out of what it grants back.
void FailoverPart::RefillReserve() {
  const uint32_t target = s_.ledger->promotion_reserve();
  if (target == 0 || s_.stopping || p_.upgrades->active() || p_.recovery->active()) return;
  const uint32_t have = s_.ledger->ReserveAvailable();
  EngineRecord* p = s_.Find(s_.primary);
  const LedgerEngine* pl = s_.ledger->engine(s_.primary);
  if (have >= target || p == nullptr || !p->is(EngineState::kPrimary) || !p->connected ||
      pl == nullptr || pl->role != LedgerRole::kHolder) {
    return;
  }
  // One at a time (an engine slow to answer is not asked twice for the same blocks), and at
  // most one a kReserveReclaimTimeout from the same primary: what it can spare may not make
  // whole chunks. A primary promoted since is asked at once: failovers a second apart would
  // otherwise find the reserve empty and wait for the barrier.
  if (p->id == own_.reserve_asked && s_.clock.Now() < own_.next_reserve_reclaim) return;
  if (s_.reclaim.from == p->id &&
      s_.clock.Now() < s_.reclaim.sent + CoordinatorState::kReclaimAnswerTimeout)
    return;
  const uint32_t chunk = s_.ledger->blocks_per_chunk();
  const uint32_t want = s_.WholeChunks(target - have);
  if (pl->blocks < want + chunk) return;  // the primary keeps a chunk at least
  if (s_.reclaim.from == p->id) {
    BATON_LOG(WARN, kLog) << "engine " << p->id << " (the primary) did not answer its Reclaim of "
                          << s_.reclaim.blocks << " blocks for the promotion reserve in "
                          << MillisBetween(s_.reclaim.sent, s_.clock.Now())
                          << " ms: it is asked again";
  }
  BATON_LOG(INFO, kLog) << "asking engine " << p->id << " (the primary) to return " << want
                        << " free blocks: the promotion reserve holds " << have << " of " << target;
  own_.next_reserve_reclaim = s_.clock.Now() + kReserveReclaimTimeout;
  own_.reserve_asked = p->id;
  if (!p_.engines->SendOrFail(*p, proto::Reclaim{.epoch = pl->epoch, .blocks = want})) return;
  s_.reclaim =
      PendingReclaim{.from = p->id, .blocks = want, .sent = s_.clock.Now(), .for_reserve = true};
}

void FailoverPart::PassBarrierOrWait(BarrierWait wait) {
  BATON_FAILPOINT("mid_barrier");  // reaped and fenced; its blocks not yet past the barrier
  const std::string held_by = s_.effects.BarrierHeldBy(wait.old);
  if (held_by.empty()) return HandOverBlocks(wait.old, wait.failover);
  BATON_LOG(WARN, kLog) << "engine " << wait.old << " (pid " << wait.pid << ") is reaped but "
                        << held_by << ": its blocks wait for the barrier";
  own_.barrier_waits[wait.old] = std::move(wait);
}

// Reaped holders whose fence found no durable epoch, tried again (at most once a second, as
// each failed try spends a batch of epochs): fenced at a new epoch, then past the barrier
// like any other, so that their blocks return to the pool.
void FailoverPart::RetryUnfencedHolders() {
  const TimePoint now = s_.clock.Now();
  if (own_.unfenced_reaped.empty() || now < own_.next_unfenced_retry) return;
  own_.next_unfenced_retry = now + std::chrono::seconds(1);
  while (!own_.unfenced_reaped.empty()) {
    const auto [id, pid] = *own_.unfenced_reaped.begin();
    Result<uint64_t> epoch = FenceHolder(id);
    if (!epoch.ok()) return;
    own_.unfenced_reaped.erase(own_.unfenced_reaped.begin());
    BATON_LOG(INFO, kLog) << "reaped engine " << id << " fenced at epoch " << *epoch;
    PassBarrierOrWait(BarrierWait{.old = id,
                                  .pid = pid,
                                  .failover = std::nullopt,
                                  .deadline = now + s_.config.gpu_release_timeout});
    ReleaseIfDone(id);
  }
}

void FailoverPart::PollBarrierWaits() {
  std::vector<std::pair<BarrierWait, bool>> ready;
  for (auto it = own_.barrier_waits.begin(); it != own_.barrier_waits.end();) {
    const bool holds = !s_.effects.BarrierHeldBy(it->first).empty();
    if (holds && s_.clock.Now() < it->second.deadline) {
      ++it;
      continue;
    }
    ready.emplace_back(it->second, holds);
    it = own_.barrier_waits.erase(it);
  }
  for (const auto& [wait, timed_out] : ready) FinishBarrierWait(wait, timed_out);
}

void FailoverPart::FinishBarrierWait(const BarrierWait& g, bool timed_out) {
  if (timed_out) {
    BATON_LOG(ERROR, kLog) << "barrier: engine " << g.old << " (pid " << g.pid
                           << "): another process of its group or cgroup is alive, or the GPU "
                           << "lists one, after "
                           << std::chrono::duration_cast<std::chrono::milliseconds>(
                                  s_.config.gpu_release_timeout)
                                  .count()
                           << " ms; every one was sent SIGKILL, so its blocks move on";
  } else if (s_.cuda_backend) {
    BATON_LOG(INFO, kLog) << "barrier: NVML no longer lists pid " << g.pid
                          << " on the GPU and no process of its group is left; its blocks move on";
  } else {
    BATON_LOG(INFO, kLog) << "barrier: no process of engine " << g.old << "'s group (pid " << g.pid
                          << ") or cgroup is left; its blocks move on";
  }
  if (g.failover.has_value()) {
    if (PromotionRecord* r = s_.timelines.Fenced(g.old, g.failover->epoch)) {
      if (timed_out) {
        r->barrier_timed_out = true;
      } else if (s_.cuda_backend) {
        r->gpu_released = s_.clock.Now();
      }
    }
  }
  HandOverBlocks(g.old, g.failover);
  ReleaseIfDone(g.old);
}

void FailoverPart::ReleaseIfDone(EngineId id) {
  if (s_.engines.count(id) != 0 || own_.barrier_waits.count(id) != 0 ||
      own_.unfenced_reaped.count(id) != 0) {
    return;
  }
  s_.effects.Release(id);
}

}  // namespace baton
