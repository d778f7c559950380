// DeviceBorrower: the engine side of the CUDA backend, for one device.
//
// At start-up (a half-started standby) it retains the device's primary context, loads the
// kernels, creates its stream, and takes the regions the owner sends over the channel
// (cuda/memory/vmm_share.h): a read-only region (the weights) is imported and mapped with READ
// access at once; a writable region (the KV pool) is imported and its address range reserved,
// but nothing is mapped (fencing rule 5: a standby maps nothing writable). Promote() is the
// whole device-side promotion: map the pool's chunks (one cuMemMap per chunk), grant
// READWRITE with one cuMemSetAccess, scrub every block header on this engine's stream and
// synchronize, so that nothing a dead holder left behind is read as metadata (the barrier
// that follows the reap of the old holder).
// Owns the context retain, the kernels, the stream and every view; destroyed in the reverse
// order. Thread-compatible: one thread (it makes the context current on it).
#pragma once

#ifdef BATON_HAVE_CUDA_HEADERS

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "base/clock.h"
#include "base/status.h"
#include "cuda/driver/cuda_handles.h"
#include "cuda/kernels/kernels.h"
#include "cuda/memory/chunk_cover.h"
#include "cuda/memory/vmm.h"
#include "cuda/memory/vmm_share.h"
#include "proto/transport/channel.h"

namespace baton {

struct PromotionPhases {
  size_t map_calls = 0;
  double map_ms = 0;     // cuMemMap of every chunk
  double access_ms = 0;  // one cuMemSetAccess READWRITE
  double scrub_ms = 0;   // header scrub launched and synchronized
  double total_ms = 0;
  uint32_t blocks = 0;
};

struct AcceptedRegion {
  std::string name;
  bool writable = false;
  uint64_t bytes = 0;
  size_t chunks = 0;
  double import_ms = 0;
  double map_ms = 0;  // read-only regions: map + access
  // Read-only regions: false where the driver refused read-only access and the region is
  // mapped read-write instead (VmmMapStats::read_only_refused).
  bool read_only = false;
};

class DeviceBorrower {
 public:
  static Result<std::unique_ptr<DeviceBorrower>> Create(const CudaDriver& driver, int device);
  // Waits (at most 5 s) for the work still on the stream before the views unmap its memory.
  ~DeviceBorrower();
  DeviceBorrower(const DeviceBorrower&) = delete;
  DeviceBorrower& operator=(const DeviceBorrower&) = delete;

  // Receives one region, imports it (and maps it READ if read-only), and acks it to the
  // owner: a failure is acked with its reason and returned.
  Result<AcceptedRegion> AcceptRegion(proto::Channel& channel, Duration timeout);
  // AcceptRegion's import and mapping of a region already received; the caller acks it.
  Result<AcceptedRegion> TakeRegion(ReceivedVmmRegion received);

  // Maps writable region `name` READWRITE and scrubs the first `header_bytes` of each
  // `block_bytes` block, waiting at most `timeout` for the scrub.
  Result<PromotionPhases> Promote(const std::string& name, uint64_t block_bytes,
                                  uint32_t header_bytes, Duration timeout);

  // The pool lent block by block (the engine SDK's path): maps READWRITE the chunks that
  // blocks [first, first + count) of writable region `name` need and that are not mapped
  // yet, scrubs those blocks' headers on this engine's stream and synchronizes. The first
  // call fixes the geometry: `block_bytes` must divide the chunk size and the region must
  // hold `block_count` blocks. A scrub that outlasts `timeout` is DeadlineExceeded with those
  // chunks left mapped and counted (the kernel may still write them); any other failure
  // undoes the mapping.
  Result<PromotionPhases> MapBlocks(const std::string& name, uint32_t first, uint32_t count,
                                    uint64_t block_bytes, uint32_t block_count,
                                    uint32_t header_bytes, Duration timeout);
  // Gives blocks back: unmaps the chunks of `name` left with no block held.
  Status UnmapBlocks(const std::string& name, uint32_t first, uint32_t count);
  // Maps READ the chunks of blocks [first, first + count) of writable region `name` in which
  // this engine holds no block (a dead predecessor's quarantined blocks, for a copy of their
  // KV): never writable, so a driver that refuses read-only access fails it. Returns how many
  // chunks it mapped. A later MapBlocks() of blocks in them makes those chunks READWRITE in
  // place (their Grant, once their barrier has passed) instead of mapping them again.
  Result<uint32_t> MapForReading(const std::string& name, uint32_t first, uint32_t count,
                                 uint64_t block_bytes, uint32_t block_count);
  // Unmaps every chunk of `name` still mapped for reading only. Work that reads them (a copy
  // on any stream) must be finished first: an unmap under a running kernel faults it.
  Status UnmapRead(const std::string& name);

  // nullptr when no region of that name was accepted.
  VmmView* view(const std::string& name);
  const PrimaryContext& context() const { return ctx_; }
  const Kernels& kernels() const { return kernels_; }
  const Stream& stream() const { return stream_; }

 private:
  DeviceBorrower() = default;
  // The chunk cover of region `name` (`pool`), made on first use with this geometry.
  Result<ChunkCover*> CoverOf(const std::string& name, const VmmView& pool, uint64_t block_bytes,
                              uint32_t block_count);

  PrimaryContext ctx_;
  Kernels kernels_;
  Stream stream_;
  std::map<std::string, VmmView> views_;
  std::map<std::string, ChunkCover> covers_;  // regions lent block by block
};

}  // namespace baton

#endif  // BATON_HAVE_CUDA_HEADERS
