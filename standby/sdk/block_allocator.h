// BlockAllocator: byte allocations carved out of the pool blocks an engine holds, for
// allocators that hand KV-cache memory to a framework (standby/sdk/baton_torch_alloc.h builds
// PyTorch's pluggable allocator on it).
//
// The engine holds extents of blocks (granted by the controller); Reset() tells the
// allocator which. Allocate(bytes) rounds up to whole blocks and takes the first run of
// consecutive free blocks that are all held (first fit, so long-lived KV buffers allocated
// at start-up pack from the bottom); Free() gives them back. Addresses are `base` + block x
// block_bytes: host pointers for the host pool, CUdeviceptr values for the device pool.
// After a grant or a return the engine calls Reset() with the new extents; free blocks follow
// them. An allocated block must be freed before its extent is returned: one that is no
// longer held is reported (FailedPrecondition names the first) and stays allocated, never
// handed out again once freed. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"

namespace baton {

struct HeldExtent {
  uint32_t first = 0;
  uint32_t count = 0;
};

class BlockAllocator {
 public:
  BlockAllocator(uint64_t base, uint64_t block_bytes, uint32_t block_count);

  Status Reset(const std::vector<HeldExtent>& held);
  // The address of `bytes` (> 0) rounded up to whole blocks, or ResourceExhausted.
  Result<uint64_t> Allocate(uint64_t bytes);
  // NotFound unless `address` came from Allocate() and is not freed yet.
  Status Free(uint64_t address);

  uint64_t free_bytes() const;
  uint64_t allocated_bytes() const;
  uint64_t block_bytes() const { return block_bytes_; }

 private:
  enum class Block : uint8_t { kNotHeld, kFree, kAllocated };

  const uint64_t base_;
  const uint64_t block_bytes_;
  mutable Mutex mu_;
  std::vector<Block> blocks_ BATON_GUARDED_BY(mu_);
  // address -> first, count
  std::map<uint64_t, std::pair<uint32_t, uint32_t>> allocations_ BATON_GUARDED_BY(mu_);
};

}  // namespace baton
