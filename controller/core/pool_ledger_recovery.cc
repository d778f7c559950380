// PoolLedger's restart path: a ledger whose blocks all belong to the previous controller
// incarnation until reconnecting engines re-adopt theirs and the caller ends the recovery.
#include <algorithm>

#include "base/log.h"
#include "controller/core/pool_ledger.h"

namespace baton {

PoolLedger PoolLedger::Recovering(uint32_t block_count, const EpochStore& epochs) {
  PoolLedger ledger(block_count, epochs);
  ledger.recovering_ = true;
  ledger.free_.clear();
  if (block_count > 0) {
    ledger.leases_[0] = Lease{kPreviousIncarnation, Extent{0, block_count}, ledger.floor_,
                              LeaseState::kQuarantined};
  }
  std::fill(ledger.fenced_from_.begin(), ledger.fenced_from_.end(), kPreviousIncarnation);
  return ledger;
}

Status PoolLedger::Readopt(EngineId id, uint64_t epoch, const std::vector<Extent>& extents) {
  if (!recovering_) return FailedPrecondition("readopt: the ledger is not recovering");
  if (id == kNoEngine || id == kPreviousIncarnation) {
    return InvalidArgument("readopt: engine id " + std::to_string(id) + " is reserved");
  }
  if (engine(id) != nullptr) {
    return Refuse(id, FailedPrecondition("readopt: " + EngineName(id) + " is known"));
  }
  if (epoch == 0 || epoch > floor_) {
    return Refuse(id, FailedPrecondition("readopt: claims epoch " + std::to_string(epoch) +
                                         ", which no previous controller issued (durable " +
                                         std::to_string(floor_) + ")"));
  }
  for (const auto& [other, e] : engines_) {
    if (e.epoch == epoch) {
      return Refuse(id, FailedPrecondition("readopt: epoch " + std::to_string(epoch) +
                                           " already held by " + EngineName(other)));
    }
  }
  std::vector<Extent> sorted = extents;
  std::sort(sorted.begin(), sorted.end(),
            [](const Extent& a, const Extent& b) { return a.first < b.first; });
  for (size_t i = 0; i < sorted.size(); ++i) {
    const Extent& x = sorted[i];
    const bool in_pool = x.count > 0 && x.first < block_count_ && x.count <= block_count_ - x.first;
    if (!in_pool || (i > 0 && sorted[i - 1].end() > x.first) ||
        !CoveredBy(x, kPreviousIncarnation, LeaseState::kQuarantined, kAnyEpoch)) {
      return Refuse(id,
                    FailedPrecondition("readopt: claimed blocks " + ToString(x) +
                                       " are outside the pool, overlap, or are already claimed"));
    }
  }
  LedgerEngine& e = engines_[id];
  e.role = LedgerRole::kHolder;
  e.epoch = epoch;
  e.promoted_seq = ++seq_;
  e.readopted = true;
  for (const Extent& x : sorted) {
    SplitAt(x.first);
    auto end = SplitAt(x.end());
    for (auto cur = leases_.lower_bound(x.first); cur != end;) cur = leases_.erase(cur);
    InsertLease(Lease{id, x, epoch, LeaseState::kGranted});
    for (uint32_t b = x.first; b < x.end(); ++b) fenced_from_[b] = kNoEngine;
    e.blocks += x.count;
  }
  BATON_LOG(INFO, "ledger") << "re-adopted " << EngineName(id) << " at epoch " << epoch << " with "
                            << e.blocks << " blocks";
  return OkStatus();
}

Result<std::vector<Extent>> PoolLedger::GrantUnclaimed(EngineId id,
                                                       const std::vector<Extent>& extents) {
  if (!recovering_) return FailedPrecondition("grant unclaimed: the ledger is not recovering");
  LedgerEngine* e = Find(id);
  if (e == nullptr || e->role != LedgerRole::kHolder || !e->readopted) {
    return FailedPrecondition("grant unclaimed: " + EngineName(id) + " is not a re-adopted holder");
  }
  std::vector<Extent> unclaimed;
  for (const Extent& x : extents) {
    const uint32_t end = std::min<uint64_t>(uint64_t{x.first} + x.count, block_count_);
    for (const auto& [first, lease] : leases_) {
      const uint32_t from = std::max(first, x.first);
      const uint32_t to = std::min(lease.extent.end(), end);
      if (from >= to || lease.holder != kPreviousIncarnation) continue;
      unclaimed.push_back(Extent{from, to - from});
    }
  }
  // Extents given twice (or overlapping) are granted once.
  std::sort(unclaimed.begin(), unclaimed.end(),
            [](const Extent& a, const Extent& b) { return a.first < b.first; });
  std::vector<Extent> merged;
  for (const Extent& x : unclaimed) {
    if (!merged.empty() && x.first <= merged.back().end()) {
      const uint32_t end = std::max(merged.back().end(), x.end());
      merged.back().count = end - merged.back().first;
    } else {
      merged.push_back(x);
    }
  }
  unclaimed = std::move(merged);
  for (const Extent& x : unclaimed) {
    SplitAt(x.first);
    auto last = SplitAt(x.end());
    for (auto cur = leases_.lower_bound(x.first); cur != last;) cur = leases_.erase(cur);
    InsertLease(Lease{id, x, e->epoch, LeaseState::kGranted});
    for (uint32_t b = x.first; b < x.end(); ++b) fenced_from_[b] = kNoEngine;
    e->blocks += x.count;
  }
  uint32_t blocks = 0;
  for (const Extent& x : unclaimed) blocks += x.count;
  if (blocks > 0) {
    BATON_LOG(INFO, "ledger") << blocks << " unclaimed blocks granted to " << EngineName(id)
                              << " at epoch " << e->epoch;
  }
  return unclaimed;
}

Status PoolLedger::EndRecovery() {
  if (!recovering_) return FailedPrecondition("end recovery: the ledger is not recovering");
  std::vector<Extent> freed = Reassign(kPreviousIncarnation, kNoEngine, 0);
  uint32_t blocks = 0;
  for (const Extent& x : freed) blocks += x.count;
  recovering_ = false;
  BATON_LOG(INFO, "ledger") << "recovery ended: " << blocks << " unclaimed blocks freed";
  return OkStatus();
}

}  // namespace baton
