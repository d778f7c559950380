#include "controller/core/pool_ledger.h"

#include <algorithm>

#include "base/log.h"

namespace baton {
namespace {

constexpr size_t kMaxTombstones = 64;

}  // namespace

std::string EngineName(EngineId id) {
  if (id == kPreviousIncarnation) return "previous-incarnation";
  return "engine " + std::to_string(id);
}

std::string ToString(const Extent& extent) {
  return "[" + std::to_string(extent.first) + ", " + std::to_string(extent.end()) + ")";
}

const char* ToString(LedgerRole role) {
  switch (role) {
    case LedgerRole::kStandby:
      return "standby";
    case LedgerRole::kHolder:
      return "holder";
    case LedgerRole::kFenced:
      return "fenced";
    case LedgerRole::kReleased:
      return "released";
  }
  return "unknown";
}

PoolLedger::PoolLedger(uint32_t block_count, const EpochStore& epochs)
    : block_count_(block_count),
      epochs_(&epochs),
      floor_(epochs.current()),
      issued_(epochs.current()),
      fenced_from_(block_count, kNoEngine) {
  if (block_count_ > 0) free_[0] = block_count_;
}

// ---------------------------------------------------------------------------------------
// Helpers

LedgerEngine* PoolLedger::Find(EngineId id) {
  auto it = engines_.find(id);
  return it == engines_.end() ? nullptr : &it->second;
}

const LedgerEngine* PoolLedger::engine(EngineId id) const {
  auto it = engines_.find(id);
  return it == engines_.end() ? nullptr : &it->second;
}

Status PoolLedger::Refuse(EngineId id, Status status) const {
  BATON_LOG(WARN, "ledger") << "refused " << EngineName(id) << ": " << status.message();
  return status;
}

Status PoolLedger::CheckSender(EngineId id, uint64_t epoch) const {
  const LedgerEngine* e = engine(id);
  if (e == nullptr) return NotFound("unknown " + EngineName(id));
  if (mutation_ == Mutation::kAcceptStale) return OkStatus();
  const std::string who = EngineName(id);
  switch (e->role) {
    case LedgerRole::kFenced:
      return FailedPrecondition(
          who + " was fenced" +
          (e->fenced_epoch ? " at epoch " + std::to_string(e->fenced_epoch) : std::string()) +
          "; stop");
    case LedgerRole::kReleased:
      return FailedPrecondition(who + " was fenced and released; stop");
    case LedgerRole::kStandby:
      if (epoch == 0) return OkStatus();
      return FailedPrecondition("standby " + who + " sent epoch " + std::to_string(epoch) +
                                "; a standby holds no epoch");
    case LedgerRole::kHolder:
      break;
  }
  if (epoch < e->epoch) {
    return FailedPrecondition("stale epoch " + std::to_string(epoch) + " (" + who +
                              " holds epoch " + std::to_string(e->epoch) + "); stop");
  }
  if (epoch > e->epoch) {
    return FailedPrecondition("epoch " + std::to_string(epoch) + " from the future (" + who +
                              " holds epoch " + std::to_string(e->epoch) + ")");
  }
  return OkStatus();
}

Status PoolLedger::CheckNewEpoch(uint64_t epoch, const char* what) const {
  if (epoch > epochs_->current()) {
    return FailedPrecondition(std::string(what) + " epoch " + std::to_string(epoch) +
                              " is not durable (journal at " + std::to_string(epochs_->current()) +
                              ")");
  }
  if (epoch <= issued_) {
    return FailedPrecondition(std::string(what) + " epoch " + std::to_string(epoch) +
                              " is not above the issued epoch " + std::to_string(issued_));
  }
  return OkStatus();
}

void PoolLedger::NoteAccepted(EngineId id, uint64_t epoch) {
  LedgerEngine* e = Find(id);
  e->accepted_seq = ++seq_;
  e->accepted_epoch = epoch;
}

// Blocks beside the engine's own first (they keep whole chunks free for others), in block
// order; then best fit: the smallest clear run holding the rest, else the largest runs first.
std::vector<Extent> PoolLedger::TakeFree(uint32_t blocks, const FreeRuns& runs) {
  std::vector<Extent> out;
  for (const Extent& run : runs.beside) {
    if (blocks == 0) break;
    const uint32_t take = std::min(run.count, blocks);
    out.push_back(Extent{run.first, take});
    blocks -= take;
  }
  auto best = runs.clear.end();
  for (auto it = runs.clear.begin(); blocks > 0 && it != runs.clear.end(); ++it) {
    if (it->count >= blocks && (best == runs.clear.end() || it->count < best->count)) best = it;
  }
  if (best != runs.clear.end()) {
    out.push_back(Extent{best->first, blocks});
  } else {
    std::vector<Extent> largest = runs.clear;
    std::stable_sort(largest.begin(), largest.end(),
                     [](const Extent& a, const Extent& b) { return a.count > b.count; });
    for (const Extent& run : largest) {
      if (blocks == 0) break;
      const uint32_t take = std::min(run.count, blocks);
      out.push_back(Extent{run.first, take});
      blocks -= take;
    }
  }
  for (const Extent& extent : out) RemoveFree(extent);
  std::sort(out.begin(), out.end(),
            [](const Extent& a, const Extent& b) { return a.first < b.first; });
  return out;
}

void PoolLedger::AddFree(Extent extent) {
  uint32_t first = extent.first;
  uint32_t count = extent.count;
  auto next = free_.lower_bound(first);
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == first) {
      first = prev->first;
      count += prev->second;
      free_.erase(prev);
    }
  }
  if (next != free_.end() && next->first == extent.end()) {
    count += next->second;
    free_.erase(next);
  }
  free_[first] = count;
}

void PoolLedger::InsertLease(Lease lease) {
  auto same = [&](const Lease& other) {
    return other.holder == lease.holder && other.epoch == lease.epoch && other.state == lease.state;
  };
  auto next = leases_.lower_bound(lease.extent.first);
  if (next != leases_.end() && next->first == lease.extent.end() && same(next->second)) {
    lease.extent.count += next->second.extent.count;
    next = leases_.erase(next);
  }
  if (next != leases_.begin()) {
    auto prev = std::prev(next);
    if (prev->second.extent.end() == lease.extent.first && same(prev->second)) {
      prev->second.extent.count += lease.extent.count;
      return;
    }
  }
  leases_.emplace(lease.extent.first, lease);
}

PoolLedger::LeaseMap::iterator PoolLedger::SplitAt(uint32_t block) {
  auto it = leases_.upper_bound(block);
  if (it == leases_.begin()) return it;
  auto prev = std::prev(it);
  Lease& lease = prev->second;
  if (lease.extent.first == block) return prev;
  if (block >= lease.extent.end()) return it;
  Lease tail = lease;
  tail.extent = Extent{block, lease.extent.end() - block};
  lease.extent.count = block - lease.extent.first;
  return leases_.emplace_hint(it, block, tail);
}

bool PoolLedger::CoveredBy(Extent extent, EngineId holder, LeaseState state, uint64_t epoch) const {
  const bool any_state = mutation_ == Mutation::kAcceptStale && holder != kPreviousIncarnation;
  uint32_t pos = extent.first;
  while (pos < extent.end()) {
    auto it = leases_.upper_bound(pos);
    if (it == leases_.begin()) return false;
    const Lease& lease = std::prev(it)->second;
    if (lease.extent.end() <= pos || lease.holder != holder) return false;
    if (!any_state && lease.state != state) return false;
    if (!any_state && epoch != kAnyEpoch && lease.epoch != epoch) return false;
    pos = lease.extent.end();
  }
  return true;
}

std::vector<Extent> PoolLedger::Reassign(EngineId from, EngineId to, uint64_t epoch) {
  std::vector<Extent> moved;
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (it->second.holder != from) {
      ++it;
      continue;
    }
    moved.push_back(it->second.extent);
    it = leases_.erase(it);
  }
  for (const Extent& extent : moved) {
    if (to == kNoEngine) {
      AddFree(extent);
    } else {
      InsertLease(Lease{to, extent, epoch, LeaseState::kGranted});
    }
  }
  return moved;
}

void PoolLedger::MarkFencedFrom(EngineId from) {
  for (const auto& [first, lease] : leases_) {
    if (lease.holder != from) continue;
    for (uint32_t b = first; b < lease.extent.end(); ++b) fenced_from_[b] = from;
  }
}

void PoolLedger::PruneTombstones() {
  size_t released = 0;
  for (const auto& [id, e] : engines_) released += e.role == LedgerRole::kReleased;
  for (auto it = engines_.begin(); released > kMaxTombstones && it != engines_.end();) {
    if (it->second.role == LedgerRole::kReleased) {
      it = engines_.erase(it);
      --released;
    } else {
      ++it;
    }
  }
}

// ---------------------------------------------------------------------------------------
// Engines

Status PoolLedger::AddStandby(EngineId id) {
  if (id == kNoEngine || id == kPreviousIncarnation || id == kMixedChunk) {
    return InvalidArgument("engine id " + std::to_string(id) + " is reserved");
  }
  if (engine(id) != nullptr) return Status(StatusCode::kAlreadyExists, EngineName(id) + " exists");
  engines_[id] = LedgerEngine{};
  return OkStatus();
}

Status PoolLedger::Promote(EngineId id, uint64_t epoch) {
  LedgerEngine* e = Find(id);
  if (e == nullptr) return NotFound("promote: unknown " + EngineName(id));
  if (e->role != LedgerRole::kStandby) {
    return FailedPrecondition("promote: " + EngineName(id) + " is " + ToString(e->role) +
                              ", not a standby");
  }
  const bool reserved = reserved_ != 0 && epoch == reserved_ && epoch <= epochs_->current();
  if (!reserved) BATON_RETURN_IF_ERROR(CheckNewEpoch(epoch, "promotion"));
  e->role = LedgerRole::kHolder;
  e->epoch = epoch;
  e->promoted_seq = ++seq_;
  issued_ = std::max(issued_, epoch);
  reserved_ = 0;
  BATON_LOG(INFO, "ledger") << "promoted " << EngineName(id) << " at epoch " << epoch;
  return OkStatus();
}

Status PoolLedger::Fence(EngineId id, uint64_t new_epoch) {
  LedgerEngine* e = Find(id);
  if (e == nullptr) return NotFound("fence: unknown " + EngineName(id));
  if (e->role != LedgerRole::kHolder) {
    return FailedPrecondition("fence: " + EngineName(id) + " is " + ToString(e->role) +
                              ", not a holder");
  }
  BATON_RETURN_IF_ERROR(CheckNewEpoch(new_epoch, "fence"));
  issued_ = reserved_ = new_epoch;
  e->role = LedgerRole::kFenced;
  e->fenced_epoch = new_epoch;
  e->fenced_seq = ++seq_;
  MarkFencedFrom(id);
  if (mutation_ == Mutation::kSkipQuarantine) {
    Reassign(id, kNoEngine, 0);
    e->blocks = 0;
  }
  for (auto& [first, lease] : leases_) {
    if (lease.holder == id) lease.state = LeaseState::kQuarantined;
  }
  BATON_LOG(INFO, "ledger") << "fenced " << EngineName(id) << " at epoch " << new_epoch << ": "
                            << e->blocks << " blocks quarantined";
  return OkStatus();
}

Status PoolLedger::FenceStandby(EngineId id) {
  LedgerEngine* e = Find(id);
  if (e == nullptr) return NotFound("fence standby: unknown " + EngineName(id));
  if (e->role != LedgerRole::kStandby) {
    return FailedPrecondition("fence standby: " + EngineName(id) + " is " + ToString(e->role));
  }
  e->role = LedgerRole::kFenced;
  e->fenced_seq = ++seq_;
  return OkStatus();
}

Result<std::vector<Extent>> PoolLedger::ReleaseAfterBarrier(EngineId id, EngineId new_holder) {
  LedgerEngine* e = Find(id);
  if (e == nullptr) return NotFound("release: unknown " + EngineName(id));
  if (e->role != LedgerRole::kFenced) {
    return FailedPrecondition("release: " + EngineName(id) + " is " + ToString(e->role) +
                              ", not fenced");
  }
  LedgerEngine* to = nullptr;
  if (new_holder != kNoEngine) {
    to = Find(new_holder);
    if (to == nullptr || to->role != LedgerRole::kHolder || to->epoch <= e->epoch) {
      return FailedPrecondition("release: " + EngineName(new_holder) +
                                " is not a holder at an epoch above " + std::to_string(e->epoch));
    }
  }
  std::vector<Extent> moved = Reassign(id, new_holder, to ? to->epoch : 0);
  if (to != nullptr) to->blocks += e->blocks;
  if (to == nullptr) {
    // Freed past the barrier: no predecessor is left to wait for, so any holder may take
    // these blocks, one older than `id` too (a rolled-back canary's go back to the primary).
    for (const Extent& x : moved) {
      for (uint32_t b = x.first; b < x.end(); ++b) fenced_from_[b] = kNoEngine;
    }
  }
  BATON_LOG(INFO, "ledger") << "released " << EngineName(id) << ": " << e->blocks << " blocks "
                            << (to ? "handed to " + EngineName(new_holder) : "freed");
  e->blocks = 0;
  e->role = LedgerRole::kReleased;
  PruneTombstones();
  return moved;
}

// ---------------------------------------------------------------------------------------
// Engine messages

Status PoolLedger::CheckMessage(EngineId id, uint64_t epoch) {
  Status status = CheckSender(id, epoch);
  if (!status.ok()) return Refuse(id, status);
  NoteAccepted(id, epoch);
  return OkStatus();
}

Result<std::vector<Extent>> PoolLedger::Grant(EngineId id, uint32_t blocks, uint64_t epoch) {
  Status status = CheckSender(id, epoch);
  if (!status.ok()) return Refuse(id, status.WithContext("grant"));
  LedgerEngine* e = Find(id);
  if (e->role != LedgerRole::kHolder && mutation_ != Mutation::kGrantToStandby) {
    return Refuse(id, FailedPrecondition("grant: " + EngineName(id) + " is a " + ToString(e->role) +
                                         "; it maps nothing writable until promoted"));
  }
  if (blocks == 0) return InvalidArgument("grant: zero blocks requested");
  NoteAccepted(id, epoch);
  const FreeRuns runs = FreeRunsFor(id);
  const uint32_t grantable = runs.blocks();
  if (grantable < blocks) {
    const uint32_t free_blocks = Snapshot().free_blocks;
    return ResourceExhausted(
        "grant: " + EngineName(id) + " asked for " + std::to_string(blocks) + " blocks, " +
        std::to_string(free_blocks) + " free" +
        (grantable < free_blocks
             ? " (" + std::to_string(grantable) + " in device pool chunks no other engine maps)"
             : ""));
  }
  std::vector<Extent> extents = TakeFree(blocks, runs);
  for (const Extent& extent : extents) {
    InsertLease(Lease{id, extent, e->epoch, LeaseState::kGranted});
  }
  e->blocks += blocks;
  return extents;
}

Status PoolLedger::Return(EngineId id, Extent extent, uint64_t epoch) {
  Status status = CheckSender(id, epoch);
  if (!status.ok()) return Refuse(id, status.WithContext("return"));
  if (extent.count == 0 || extent.first >= block_count_ ||
      extent.count > block_count_ - extent.first) {
    return Refuse(
        id, InvalidArgument("return: extent " + ToString(extent) + " is outside the pool of " +
                            std::to_string(block_count_) + " blocks"));
  }
  LedgerEngine* e = Find(id);
  if (!CoveredBy(extent, id, LeaseState::kGranted, e->epoch)) {
    return Refuse(id,
                  FailedPrecondition("return: " + EngineName(id) + " does not hold blocks " +
                                     ToString(extent) + " at epoch " + std::to_string(e->epoch)));
  }
  NoteAccepted(id, epoch);
  SplitAt(extent.first);
  auto it = SplitAt(extent.end());
  for (auto cur = leases_.lower_bound(extent.first); cur != it;) cur = leases_.erase(cur);
  AddFree(extent);
  e->blocks -= extent.count;
  return OkStatus();
}

// ---------------------------------------------------------------------------------------
// Queries

Status PoolLedger::CheckMapWritable(EngineId id, Extent extent, uint64_t epoch) const {
  BATON_RETURN_IF_ERROR(CheckSender(id, epoch));
  const LedgerEngine* e = engine(id);
  if (e->role != LedgerRole::kHolder) {
    return FailedPrecondition(EngineName(id) + " is a " + ToString(e->role) +
                              "; it maps nothing writable");
  }
  if (extent.count == 0 || !CoveredBy(extent, id, LeaseState::kGranted, e->epoch)) {
    return FailedPrecondition(EngineName(id) + " does not hold blocks " + ToString(extent));
  }
  return OkStatus();
}

EngineId PoolLedger::UsedBy(uint32_t block) const {
  auto it = leases_.upper_bound(block);
  if (it == leases_.begin()) return kNoEngine;
  const Lease& lease = std::prev(it)->second;
  if (block >= lease.extent.end() || lease.state != LeaseState::kGranted) return kNoEngine;
  return lease.holder;
}

std::vector<Lease> PoolLedger::LeasesOf(EngineId id) const {
  std::vector<Lease> out;
  for (const auto& [first, lease] : leases_) {
    if (lease.holder == id) out.push_back(lease);
  }
  return out;
}

LedgerSnapshot PoolLedger::Snapshot() const {
  LedgerSnapshot s;
  s.block_count = block_count_;
  for (const auto& [first, count] : free_) s.free_blocks += count;
  for (const auto& [first, lease] : leases_) {
    (lease.state == LeaseState::kGranted ? s.granted_blocks : s.quarantined_blocks) +=
        lease.extent.count;
  }
  s.leases = leases_.size();
  s.free_runs = free_.size();
  s.issued_epoch = issued_;
  s.recovering = recovering_;
  s.engines = engines_;
  return s;
}

}  // namespace baton
