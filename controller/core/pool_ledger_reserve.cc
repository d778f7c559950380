// PoolLedger's promotion reserve: free blocks (whole chunks on a device pool) that Grant leaves
// alone, so that a standby promoted while its predecessor's blocks are quarantined starts on
// blocks that predecessor does not hold (docs/architecture.md, "Fencing rules").
#include <algorithm>
#include <string>
#include <vector>

#include "base/log.h"
#include "controller/core/pool_ledger.h"

namespace baton {

uint32_t PoolLedger::InWholeChunks(uint32_t blocks) const {
  if (blocks == 0) return 0;
  const uint64_t per = blocks_per_chunk_;
  const uint64_t chunks = (uint64_t{blocks} + per - 1) / per;
  return static_cast<uint32_t>(std::min<uint64_t>(chunks * per, block_count_));
}

Status PoolLedger::SetPromotionReserve(uint32_t blocks) {
  reserve_ = 0;
  const uint32_t whole = InWholeChunks(blocks);
  if (whole > block_count_ / 2) {
    return FailedPrecondition(
        "a promotion reserve of " + std::to_string(blocks) + " blocks (" + std::to_string(whole) +
        " in whole pool chunks of " + std::to_string(blocks_per_chunk_) +
        ") is more than half the pool of " + std::to_string(block_count_) + " blocks");
  }
  reserve_ = whole;
  return OkStatus();
}

// The highest clear runs, whole chunk by whole chunk (clear runs are whole chunks: a chunk
// nobody leases is all free), until the target is covered.
void PoolLedger::HoldBackReserve(FreeRuns* runs) const {
  uint32_t left = reserve_;
  const uint32_t per = blocks_per_chunk_;
  while (left > 0 && !runs->clear.empty()) {
    Extent& run = runs->clear.back();
    uint32_t take = std::min(left, run.count);
    if (per > 1) {
      // The last chunk of the run: from its start (or the run's) to the run's end.
      const uint32_t chunk_first = std::max(run.first, (run.end() - 1) / per * per);
      take = run.end() - chunk_first;
    }
    const Extent piece{run.end() - take, take};
    if (!runs->reserve.empty() && runs->reserve.front().first == piece.end()) {
      runs->reserve.front() = Extent{piece.first, piece.count + runs->reserve.front().count};
    } else {
      runs->reserve.insert(runs->reserve.begin(), piece);
    }
    run.count -= take;
    left -= std::min(left, take);
    if (run.count == 0) runs->clear.pop_back();
  }
}

uint32_t PoolLedger::ReserveAvailable() const {
  uint32_t n = 0;
  for (const Extent& x : FreeRunsFor(kNoEngine).reserve) n += x.count;
  return n;
}

Result<std::vector<Extent>> PoolLedger::GrantReserve(EngineId id, uint64_t epoch) {
  Status status = CheckSender(id, epoch);
  if (!status.ok()) return Refuse(id, status.WithContext("grant the reserve"));
  LedgerEngine* e = Find(id);
  if (e->role != LedgerRole::kHolder) {
    return Refuse(id, FailedPrecondition("grant the reserve: " + EngineName(id) + " is a " +
                                         ToString(e->role) + ", not a promoted holder"));
  }
  const std::vector<Extent> reserve = FreeRunsFor(id).reserve;
  uint32_t blocks = 0;
  for (const Extent& x : reserve) blocks += x.count;
  if (reserve_ == 0 || blocks < reserve_) {
    return FailedPrecondition("the promotion reserve holds " + std::to_string(blocks) + " of " +
                              std::to_string(reserve_) + " blocks");
  }
  NoteAccepted(id, epoch);
  std::vector<Extent> extents = reserve;
  for (const Extent& x : extents) {
    RemoveFree(x);
    InsertLease(Lease{id, x, e->epoch, LeaseState::kGranted});
  }
  e->blocks += blocks;
  if (mutation_ == Mutation::kHandOnQuarantined) HandOnQuarantinedForTesting(id, epoch, &extents);
  BATON_LOG(INFO, "ledger") << "granted the promotion reserve of " << blocks << " blocks to "
                            << EngineName(id) << " at epoch " << epoch;
  return extents;
}

// The deliberate bug: the first block of a fenced engine's quarantine goes to `id` as if its
// barrier had passed (its fence mark stays, as the real hand-over would clear it only then).
void PoolLedger::HandOnQuarantinedForTesting(EngineId id, uint64_t epoch,
                                             std::vector<Extent>* extents) {
  if (blocks_per_chunk_ > 1) return;  // a chunk shared with the fenced engine: rule 1 first
  for (const auto& [first, lease] : leases_) {
    if (lease.state != LeaseState::kQuarantined || lease.holder == kPreviousIncarnation) continue;
    const uint32_t block = first;
    const EngineId from = lease.holder;
    SplitAt(block + 1);
    leases_.erase(block);
    Find(from)->blocks -= 1;
    InsertLease(Lease{id, Extent{block, 1}, epoch, LeaseState::kGranted});
    Find(id)->blocks += 1;
    extents->push_back(Extent{block, 1});
    return;
  }
}

}  // namespace baton
