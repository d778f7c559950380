// PagedKvCache: the KV cache of the compute core, kept in fixed-size blocks of memory that
// someone else owns (in the engine: controller pool blocks mapped into the reserved range).
//
// Layout of one block (fp32): [layer][K=0 | V=1][kv_head][slot][head_dim], with
// `block_tokens` slots. A token at position p of a sequence lives in slot p % block_tokens of
// the sequence's block p / block_tokens; for one (layer, K|V, head) a block's slots are
// contiguous, so attention reads rows of head_dim floats in order.
//
// The cache knows the blocks it was given (AddBlock/AddRegion), hands free ones to
// sequences (Reserve: all or nothing, ResourceExhausted when too few are free) and takes
// them back (Release). A KvSequence is the caller's: its block table and how many tokens
// are stored. The cache never allocates or frees the block memory itself; whoever gave a
// block keeps it mapped until RemoveBlock or the cache's end. Move-only; used from the one
// compute thread (Row() may be read by the ComputePool's workers during a step).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <vector>

#include "base/status.h"

namespace baton {

using KvBlockId = uint32_t;

struct KvLayout {
  int layers = 0;
  int kv_heads = 0;
  int head_dim = 0;
  int block_tokens = 0;

  Status Validate() const;
  size_t block_bytes() const;
  // Offset in floats of the head_dim-float row of (layer, which, head, slot) in a block.
  size_t RowOffset(int layer, int which, int head, int slot) const {
    const size_t plane = (static_cast<size_t>(layer) * 2 + which) * kv_heads + head;
    return (plane * block_tokens + slot) * head_dim;
  }
};

struct KvSequence {
  std::vector<KvBlockId> blocks;  // the block table
  int64_t length = 0;             // tokens whose K and V are stored
};

class PagedKvCache {
 public:
  static constexpr KvBlockId kMaxBlockId = (1u << 24) - 1;

  static Result<PagedKvCache> Create(const KvLayout& layout);
  PagedKvCache(PagedKvCache&&) = default;
  PagedKvCache& operator=(PagedKvCache&&) = default;
  PagedKvCache(const PagedKvCache&) = delete;
  PagedKvCache& operator=(const PagedKvCache&) = delete;

  const KvLayout& layout() const { return layout_; }

  // Adds a free block of `bytes` (at least layout().block_bytes()) at `data` (4-byte
  // aligned). Refuses a known id or an id above kMaxBlockId.
  Status AddBlock(KvBlockId id, void* data, size_t bytes);
  // The same for a block that already holds data a sequence will take: it is counted as used
  // (not free) until a Release of a KvSequence that lists it (KvHooks: KV kept for a request).
  Status AddHeldBlock(KvBlockId id, void* data, size_t bytes);
  // Adds `count` blocks with ids first_id.. laid out `stride` bytes apart from `base`.
  Status AddRegion(KvBlockId first_id, void* base, size_t stride, size_t count);
  // Forgets a free block; refuses one that a sequence holds.
  Status RemoveBlock(KvBlockId id);

  size_t total_blocks() const { return total_; }
  // The most blocks the cache may hold: the most it ever held, or what SetReachableBlocks
  // said (a pool shared with other engines: blocks may be granted later or come back).
  size_t reachable_blocks() const { return std::max(peak_, reachable_); }
  void SetReachableBlocks(size_t blocks) { reachable_ = blocks; }
  size_t free_blocks() const { return free_.size(); }
  // Blocks a sequence of `tokens` tokens occupies.
  int64_t BlocksFor(int64_t tokens) const;

  // Grows seq's block table so that it holds `tokens` tokens.
  Status Reserve(KvSequence* seq, int64_t tokens);
  // The same for several sequences at once: either every one grows or none does.
  Status Reserve(std::span<KvSequence* const> seqs, std::span<const int64_t> tokens);
  // Returns the sequence's blocks to the free list and empties it.
  void Release(KvSequence* seq);

  // The row of (layer, which, head) for position `pos`, inside the sequence's blocks.
  float* Row(const KvSequence& seq, int layer, int which, int head, int64_t pos) const {
    const int64_t b = pos / layout_.block_tokens;
    const int slot = static_cast<int>(pos % layout_.block_tokens);
    return BlockData(seq.blocks[b]) + layout_.RowOffset(layer, which, head, slot);
  }
  float* BlockData(KvBlockId id) const { return data_[id]; }

 private:
  explicit PagedKvCache(const KvLayout& layout) : layout_(layout) {}
  enum class State : uint8_t { kAbsent, kFree, kUsed };
  Status Insert(KvBlockId id, void* data, size_t bytes, State state);

  KvLayout layout_;
  std::vector<float*> data_;    // indexed by block id
  std::vector<State> state_;    // indexed by block id
  std::deque<KvBlockId> free_;  // handed out in the order they were added or released
  size_t total_ = 0;
  size_t peak_ = 0;
  size_t reachable_ = 0;
};

}  // namespace baton
