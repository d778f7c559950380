#include "standby/sdk/block_allocator.h"

#include <string>

namespace baton {

BlockAllocator::BlockAllocator(uint64_t base, uint64_t block_bytes, uint32_t block_count)
    : base_(base), block_bytes_(block_bytes), blocks_(block_count, Block::kNotHeld) {}

Status BlockAllocator::Reset(const std::vector<HeldExtent>& held) {
  MutexLock lock(mu_);
  std::vector<bool> is_held(blocks_.size(), false);
  for (const HeldExtent& e : held) {
    if (e.first >= blocks_.size() || e.count > blocks_.size() - e.first) {
      return InvalidArgument("extent [" + std::to_string(e.first) + ", +" +
                             std::to_string(e.count) + ") lies outside the pool of " +
                             std::to_string(blocks_.size()) + " blocks");
    }
    for (uint32_t b = e.first; b < e.first + e.count; ++b) is_held[b] = true;
  }
  // Free blocks follow the extents in any case (a returned block is never handed out again);
  // an allocated block that is no longer held is reported, and stays allocated until freed.
  std::string lost;
  for (size_t b = 0; b < blocks_.size(); ++b) {
    if (blocks_[b] != Block::kAllocated) {
      blocks_[b] = is_held[b] ? Block::kFree : Block::kNotHeld;
    } else if (!is_held[b] && lost.empty()) {
      lost = std::to_string(b);
    }
  }
  if (!lost.empty()) {
    return FailedPrecondition("block " + lost +
                              " is allocated but no longer held: free it before returning it");
  }
  return OkStatus();
}

Result<uint64_t> BlockAllocator::Allocate(uint64_t bytes) {
  if (bytes == 0 || block_bytes_ == 0) return InvalidArgument("allocation of 0 bytes");
  const uint64_t want = bytes / block_bytes_ + (bytes % block_bytes_ != 0 ? 1 : 0);
  MutexLock lock(mu_);
  if (want > blocks_.size()) {
    return ResourceExhausted(std::to_string(bytes) + " bytes is more than the whole pool");
  }
  uint64_t run = 0;
  for (size_t b = 0; b < blocks_.size(); ++b) {
    run = blocks_[b] == Block::kFree ? run + 1 : 0;
    if (run < want) continue;
    const uint32_t first = static_cast<uint32_t>(b + 1 - want);
    for (uint32_t i = first; i <= b; ++i) blocks_[i] = Block::kAllocated;
    const uint64_t address = base_ + uint64_t{first} * block_bytes_;
    allocations_[address] = {first, static_cast<uint32_t>(want)};
    return address;
  }
  return ResourceExhausted("no run of " + std::to_string(want) + " free blocks (" +
                           std::to_string(bytes) + " bytes) among the held extents");
}

Status BlockAllocator::Free(uint64_t address) {
  MutexLock lock(mu_);
  auto it = allocations_.find(address);
  if (it == allocations_.end()) {
    return NotFound("address " + std::to_string(address) + " is not an allocation");
  }
  const auto [first, count] = it->second;
  for (uint32_t b = first; b < first + count; ++b) blocks_[b] = Block::kFree;
  allocations_.erase(it);
  return OkStatus();
}

uint64_t BlockAllocator::free_bytes() const {
  MutexLock lock(mu_);
  uint64_t n = 0;
  for (Block b : blocks_) n += b == Block::kFree ? 1 : 0;
  return n * block_bytes_;
}

uint64_t BlockAllocator::allocated_bytes() const {
  MutexLock lock(mu_);
  uint64_t n = 0;
  for (const auto& [address, run] : allocations_) n += run.second;
  return n * block_bytes_;
}

}  // namespace baton
