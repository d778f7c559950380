// ChunkCover: which chunks of a device pool an engine must have mapped for the blocks it
// holds.
//
// On the CUDA backend the pool is made of VMM chunks (cuda/memory/vmm.h) and the driver maps whole
// chunks only, while the ledger lends blocks. A chunk holds `blocks_per_chunk` whole blocks
// (the owner picks the chunk size as a multiple of the block size). ChunkCover counts, per
// chunk, the blocks this engine holds: Add() returns the chunks that went from none to some
// (map them), Remove() the chunks that went back to none (unmap them). Blocks of a mapped chunk
// that the engine does not hold stay unleased: no other engine maps them writable, because
// only the primary maps the pool (fencing rules 1 and 5).
// A promoted engine may also read the chunks of a dead predecessor's quarantined blocks, for a
// copy of the KV they hold: AddReadOnly() returns the chunks to map READ (those holding no
// block of this engine; the ledger never lends a block in a chunk where another engine's
// blocks wait in quarantine, so only their own Grant puts them there, and the engine keeps
// what it copies from until the copy is done), DropReadOnly() those to unmap once it is. A chunk
// read that the engine is then granted blocks in is not mapped again: Add() reports it in
// `upgraded` (set its access to READWRITE) and it stays mapped from then on as a held one.
// Pure bookkeeping, no CUDA. Thread-compatible.
#pragma once

#include <cstdint>
#include <vector>

#include "base/status.h"

namespace baton {

struct ChunkSpan {
  uint32_t first = 0;  // chunk index
  uint32_t count = 0;
  bool operator==(const ChunkSpan&) const = default;
};

class ChunkCover {
 public:
  ChunkCover() = default;
  // InvalidArgument unless blocks_per_chunk > 0 and chunk_count covers block_count blocks.
  static Result<ChunkCover> Create(uint32_t block_count, uint32_t blocks_per_chunk,
                                   uint32_t chunk_count);

  // Blocks [first, first + count) are now held; each must not be held already. Returns the
  // chunks to map; those mapped READ until now are in `upgraded` instead (not returned).
  Result<std::vector<ChunkSpan>> Add(uint32_t first, uint32_t count,
                                     std::vector<ChunkSpan>* upgraded);
  // The same, where no chunk is ever mapped READ (AddReadOnly() never called).
  Result<std::vector<ChunkSpan>> Add(uint32_t first, uint32_t count) {
    std::vector<ChunkSpan> upgraded;
    return Add(first, count, &upgraded);
  }
  // Blocks [first, first + count) are given back; each must be held.
  Result<std::vector<ChunkSpan>> Remove(uint32_t first, uint32_t count);

  // The chunks of blocks [first, first + count) to map READ: those with no held block and not
  // read already (they are counted as read from now on).
  Result<std::vector<ChunkSpan>> AddReadOnly(uint32_t first, uint32_t count);
  // Every chunk still mapped READ only (to unmap); none is counted as read after.
  std::vector<ChunkSpan> DropReadOnly();
  // Undoes AddReadOnly() of `spans` (their mapping failed).
  void ForgetReadOnly(const std::vector<ChunkSpan>& spans);

  uint32_t blocks_per_chunk() const { return blocks_per_chunk_; }
  uint32_t mapped_chunks() const;
  uint32_t held_blocks() const;
  uint32_t read_only_chunks() const;

 private:
  Status CheckRange(uint32_t first, uint32_t count) const;
  // Consecutive chunk indices as spans.
  static std::vector<ChunkSpan> Spans(const std::vector<uint32_t>& chunks);

  uint32_t block_count_ = 0;
  uint32_t blocks_per_chunk_ = 0;
  std::vector<uint32_t> held_per_chunk_;
  std::vector<bool> held_;       // per block
  std::vector<bool> read_only_;  // per chunk: mapped READ, no block held
};

}  // namespace baton
