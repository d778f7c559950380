// PoolMapping: an engine's view of the controller's KV-cache pool: one reserved address range
// and the extents of it that are mapped writable.
//
// Reserve() sets aside block_count x block_bytes of address space with PROT_NONE
// (MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE), aligned to 2 MiB so that a hugetlb pool can be
// mapped into it. Block b always lives at base + b x block_bytes. MapExtent() maps blocks of
// the pool fd there with MAP_FIXED|MAP_SHARED, PROT_READ|PROT_WRITE; UnmapExtent() puts the
// PROT_NONE reservation back over them (mmap MAP_FIXED anonymous), so no page of the pool
// stays reachable and the range stays reserved. Nothing is writable until MapExtent: a
// standby's range is all PROT_NONE (fencing rule 5). ScrubHeaders() zeroes the first
// kBlockHeaderBytes of every block of an extent. MapReadOnly() maps blocks PROT_READ (a
// predecessor's quarantined blocks, to copy KV out of); MapExtent() over them makes them
// writable (they were granted), UnmapReadOnly() puts PROT_NONE back over the rest.
//
// MapHeaderView() maps the whole pool once more, read-only, at an address of its own (the
// header view), and PrefaultHeaderView() reads one byte of blocks' first pages through it, so
// that ReadHeaders() copies a dead primary's headers out of memory already mapped (about
// 0.06 us a block) instead of one pread per block (0.4-2 us). Nothing of the view is
// writable; a block's data stays unreachable through the reservation until MapExtent.
//
// Ownership: owns the pool fd, the reservation, its extent mappings and the header view; the
// destructor unmaps them all. Move-only. Thread-compatible: the engine session guards it.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <span>
#include <vector>

#include "base/io/unique_fd.h"
#include "base/status.h"

namespace baton {

// Blocks [first, first + count) of the pool.
struct BlockRun {
  uint32_t first = 0;
  uint32_t count = 0;
};

struct PoolGeometryArgs {
  uint32_t block_count = 0;
  uint64_t block_bytes = 0;
  uint64_t reserve_bytes = 0;  // at least block_count x block_bytes
  bool huge_pages = false;     // the pool fd is hugetlb: block_bytes must be a 2 MiB multiple
};

class PoolMapping {
 public:
  PoolMapping() = default;
  // Checks the geometry against the fd's size and reserves the range.
  static Result<PoolMapping> Reserve(UniqueFd pool_fd, const PoolGeometryArgs& args);
  ~PoolMapping();
  PoolMapping(PoolMapping&& other) noexcept;
  PoolMapping& operator=(PoolMapping&& other) noexcept;
  PoolMapping(const PoolMapping&) = delete;
  PoolMapping& operator=(const PoolMapping&) = delete;

  // Maps blocks [first, first + count) writable. Refuses a range outside the pool or one
  // that overlaps an extent already mapped.
  Status MapExtent(uint32_t first, uint32_t count);
  // Unmaps blocks [first, first + count), which must lie inside mapped extents.
  Status UnmapExtent(uint32_t first, uint32_t count);
  // Maps blocks [first, first + count) read-only. Refuses a range outside the pool or one that
  // overlaps a writable extent.
  Status MapReadOnly(uint32_t first, uint32_t count);
  // Unmaps every block mapped read-only (not since mapped writable).
  void UnmapReadOnly();
  bool IsReadOnly(uint32_t block) const { return read_only_.count(block) != 0; }
  // Appends the header bytes of each block in [first, first + count) to `out` (zeros for a
  // block mapped neither writable nor read-only).
  void CopyHeaders(uint32_t first, uint32_t count, uint64_t header_bytes,
                   std::vector<uint8_t>* out) const;
  // Maps the header view. FailedPrecondition when the pool's fd is not sealed against
  // shrinking (a read through the view past a shrunk end would raise SIGBUS): ReadHeaders()
  // then reads with pread.
  Status MapHeaderView();
  bool has_header_view() const { return header_view_ != nullptr; }
  // Faults in the first page of blocks [first, first + count) in the header view (a page
  // table entry each: on 4 KiB pages one page-table page per 2 MiB block). No-op without it.
  void PrefaultHeaderView(uint32_t first, uint32_t count) const;
  // Appends the header bytes of each block of each run to `out`, run after run, copied from
  // the header view when there is one, else read from the pool's file (pread), whether the
  // block is mapped writable or not: nothing is mapped or unmapped. A promotion reads the dead
  // primary's blocks, tens of thousands on a large pool, so many blocks are read by up to
  // `threads` threads side by side (at least kHeaderBlocksPerThread blocks each, or
  // kViewBlocksPerThread from the view). Returns
  // one Status per run: a run outside the pool, or one with a read that fails (the error
  // names the block), adds nothing to `out`.
  static constexpr uint32_t kHeaderBlocksPerThread = 512;
  static constexpr uint32_t kViewBlocksPerThread = 8192;
  std::vector<Status> ReadHeaders(std::span<const BlockRun> runs, uint64_t header_bytes,
                                  unsigned threads, std::vector<uint8_t>* out) const;
  // Zeroes the header bytes of each block in [first, first + count) (must be mapped).
  void ScrubHeaders(uint32_t first, uint32_t count, uint64_t header_bytes);
  // Unmaps every extent.
  void UnmapAll();

  uint8_t* base() const { return base_; }
  uint64_t reserved_bytes() const { return reserved_; }
  uint32_t block_count() const { return args_.block_count; }
  uint64_t block_bytes() const { return args_.block_bytes; }
  bool huge_pages() const { return args_.huge_pages; }
  uint8_t* BlockData(uint32_t block) const { return base_ + uint64_t{block} * args_.block_bytes; }
  // Mapped extents {first, count}, coalesced, in block order.
  const std::map<uint32_t, uint32_t>& mapped() const { return mapped_; }
  uint32_t mapped_blocks() const;
  // True if block `b` is mapped writable.
  bool IsMapped(uint32_t block) const;

 private:
  void Release();
  Status CheckRange(uint32_t first, uint32_t count) const;
  // Maps the blocks of the pool's file at their place with `prot`; FailedPrecondition when one
  // of them is mapped writable already.
  Status MapInPlace(uint32_t first, uint32_t count, int prot);

  UniqueFd fd_;
  PoolGeometryArgs args_;
  uint8_t* region_ = nullptr;  // what mmap returned (before alignment)
  uint64_t region_bytes_ = 0;
  uint8_t* base_ = nullptr;  // 2 MiB-aligned start inside region_
  uint64_t reserved_ = 0;
  std::map<uint32_t, uint32_t> mapped_;  // first -> count
  std::set<uint32_t> read_only_;         // blocks mapped PROT_READ
  uint8_t* header_view_ = nullptr;       // the whole pool, PROT_READ, or null
  uint64_t header_view_bytes_ = 0;
};

}  // namespace baton
