// PoolLedger on a device pool mapped by chunks: which free blocks an engine may be granted,
// and rule 1 at chunk granularity (no chunk leased to two engines).
#include <algorithm>
#include <string>
#include <vector>

#include "controller/core/pool_ledger.h"

namespace baton {

Status PoolLedger::SetBlocksPerChunk(uint32_t blocks_per_chunk) {
  if (blocks_per_chunk == 0) return InvalidArgument("a pool chunk holds at least one block");
  blocks_per_chunk_ = blocks_per_chunk;
  return OkStatus();
}

uint32_t PoolLedger::FreeRuns::blocks() const {
  uint32_t n = 0;
  for (const Extent& run : beside) n += run.count;
  for (const Extent& run : clear) n += run.count;
  return n;
}

uint32_t PoolLedger::GrantableTo(EngineId id) const { return FreeRunsFor(id).blocks(); }

uint32_t PoolLedger::FreeBesideHeld(EngineId id) const {
  uint32_t n = 0;
  for (const Extent& run : FreeRunsFor(id).beside) n += run.count;
  return n;
}

void PoolLedger::RemoveFree(Extent extent) {
  auto it = std::prev(free_.upper_bound(extent.first));
  const uint32_t first = it->first;
  const uint32_t end = first + it->second;
  free_.erase(it);
  if (extent.first > first) free_[first] = extent.first - first;
  if (extent.end() < end) free_[extent.end()] = end - extent.end();
}

std::vector<EngineId> PoolLedger::ChunkHolders(bool count_previous) const {
  const uint64_t per = blocks_per_chunk_;
  std::vector<EngineId> holders((uint64_t{block_count_} + per - 1) / per, kNoEngine);
  for (const auto& [first, lease] : leases_) {
    if (lease.holder == kPreviousIncarnation && !count_previous) continue;
    const uint64_t last = (uint64_t{lease.extent.end()} - 1) / per;
    for (uint64_t c = first / per; c <= last; ++c) {
      if (holders[c] == kNoEngine) {
        holders[c] = lease.holder;
      } else if (holders[c] != lease.holder) {
        holders[c] = kMixedChunk;
      }
    }
  }
  return holders;
}

PoolLedger::FreeRuns PoolLedger::FreeRunsFor(EngineId id) const {
  FreeRuns runs;
  if (blocks_per_chunk_ <= 1) {
    for (const auto& [first, count] : free_) runs.clear.push_back(Extent{first, count});
    HoldBackReserve(&runs);
    return runs;
  }
  auto append = [](std::vector<Extent>& to, uint32_t first, uint32_t end) {
    if (!to.empty() && to.back().end() == first) {
      to.back().count += end - first;
    } else {
      to.push_back(Extent{first, end - first});
    }
  };
  const uint64_t per = blocks_per_chunk_;
  const std::vector<EngineId> holders = ChunkHolders(/*count_previous=*/true);
  for (const auto& [first, count] : free_) {
    const uint64_t end = uint64_t{first} + count;
    for (uint64_t b = first; b < end;) {
      const uint64_t chunk = b / per;
      const uint64_t piece_end = std::min(end, (chunk + 1) * per);
      if (holders[chunk] == id && id != kNoEngine) {
        append(runs.beside, static_cast<uint32_t>(b), static_cast<uint32_t>(piece_end));
      } else if (holders[chunk] == kNoEngine) {
        append(runs.clear, static_cast<uint32_t>(b), static_cast<uint32_t>(piece_end));
      }
      b = piece_end;
    }
  }
  HoldBackReserve(&runs);
  return runs;
}

// Rule 1 on a chunked device pool: an engine maps every chunk it holds a block of, so a chunk
// with blocks of two engines would be mapped writable by both. Blocks quarantined to the
// previous incarnation are not mapped by any engine of this one.
Status PoolLedger::CheckChunks() const {
  if (blocks_per_chunk_ <= 1) return OkStatus();
  const std::vector<EngineId> holders = ChunkHolders(/*count_previous=*/false);
  for (uint32_t c = 0; c < holders.size(); ++c) {
    if (holders[c] != kMixedChunk) continue;
    std::string who;
    for (const auto& [first, lease] : leases_) {
      const uint64_t lo = first / blocks_per_chunk_;
      const uint64_t hi = (uint64_t{lease.extent.end()} - 1) / blocks_per_chunk_;
      if (lo <= c && c <= hi && lease.holder != kPreviousIncarnation) {
        who += (who.empty() ? "" : ", ") + EngineName(lease.holder) + " " + ToString(lease.extent);
      }
    }
    return Internal("invariant 1 (one writer per block): device pool chunk " + std::to_string(c) +
                    " holds blocks of several engines: " + who);
  }
  return OkStatus();
}

}  // namespace baton
