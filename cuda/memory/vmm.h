// VmmRegion and VmmView: device (or host-NUMA) memory made of cuMemCreate chunks that cross
// process boundaries as POSIX fds, and the address ranges each process maps them into.
//
// The owner (the controller) creates a VmmRegion: `chunk_count` allocations of `chunk_bytes`
// each (a multiple of the allocation granularity), exportable as fds
// (cuMemExportToShareableHandle). Chunks are large (256 MiB to 1 GiB) so that mapping a
// whole region is a few hundred cuMemMap calls, not tens of thousands.
//
// A VmmView is one process's window on a region: an address range reserved with
// cuMemAddressReserve, the chunk handles (imported from fds, or borrowed from the owner's
// VmmRegion), and the mappings made so far. Map() maps whole chunks (one cuMemMap each, at
// offset 0 of the chunk: the driver takes no other offset) and grants access with a single
// cuMemSetAccess over the range: READ for weights, READWRITE for the pool. So the CUDA
// backend lends the pool in chunk-sized units. Unmap() takes back whole chunks.
// Every import is paired with its release (AllocationHandle), every mapping with its unmap,
// the reservation with its free, in that order on destruction.
// Thread-compatible: one thread at a time; the context must be current on it.
#pragma once

#ifdef BATON_HAVE_CUDA_HEADERS

#include <cuda.h>

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "base/io/unique_fd.h"
#include "base/status.h"
#include "cuda/driver/cuda_handles.h"

namespace baton {

enum class VmmLocation { kDevice, kHostNuma };
enum class VmmAccess { kRead, kReadWrite };

struct VmmRegionSpec {
  std::string name = "pool";
  uint64_t bytes = 0;                 // rounded up to whole chunks
  uint64_t chunk_bytes = 512u << 20;  // rounded up to the allocation granularity
  VmmLocation location = VmmLocation::kDevice;
  int numa_node = 0;  // for kHostNuma
};

// The allocation properties of a region's chunks on `device` (exportable as POSIX fds).
CUmemAllocationProp VmmChunkProp(const PrimaryContext& ctx, VmmLocation location, int numa_node);
// cuMemGetAllocationGranularity (minimum) for those properties.
Result<size_t> VmmGranularity(const PrimaryContext& ctx, VmmLocation location, int numa_node);

class VmmRegion {
 public:
  VmmRegion() = default;
  static Result<VmmRegion> Create(const PrimaryContext& ctx, const VmmRegionSpec& spec);
  // A region another owner made and exported (one fd per chunk, in order, each an allocation
  // of `chunk_bytes`, a multiple of the granularity): a restarted controller taking back what
  // baton-keeper kept. The region keeps the fds; ExportAll() returns dups of them (the
  // driver is not asked to export an imported allocation again). That each allocation holds
  // chunk_bytes is proven by mapping it (VmmView::Map), not here.
  static Result<VmmRegion> Import(const PrimaryContext& ctx, std::string name, uint64_t chunk_bytes,
                                  std::vector<UniqueFd> fds,
                                  VmmLocation location = VmmLocation::kDevice, int numa_node = 0);

  // One new fd per chunk, in order, for sending to a borrower.
  Result<std::vector<UniqueFd>> ExportAll() const;

  const std::string& name() const { return name_; }
  uint64_t chunk_bytes() const { return chunk_bytes_; }
  size_t chunk_count() const { return chunks_.size(); }
  uint64_t bytes() const { return chunk_bytes_ * chunks_.size(); }
  size_t granularity() const { return granularity_; }
  VmmLocation location() const { return location_; }
  int numa_node() const { return numa_node_; }
  const AllocationHandle& chunk(size_t i) const { return chunks_[i]; }

 private:
  std::string name_;
  uint64_t chunk_bytes_ = 0;
  size_t granularity_ = 0;
  VmmLocation location_ = VmmLocation::kDevice;
  int numa_node_ = 0;
  std::vector<AllocationHandle> chunks_;
  std::vector<UniqueFd> imported_fds_;  // Import(): the fds the chunks came from
};

struct VmmMapStats {
  size_t map_calls = 0;
  double map_ms = 0;     // the cuMemMap calls
  double access_ms = 0;  // the cuMemSetAccess call
  // kRead was asked and the driver refused read-only access: the range is mapped read-write
  // (logged as a warning), so it works but is not protected against stray writes.
  bool read_only_refused = false;
};

struct VmmMapOptions {
  VmmAccess access = VmmAccess::kReadWrite;
  // >= 0: also grant the CPU access (host-NUMA regions on that node only): the pinned cache.
  int host_numa_node = -1;
  // kRead refused by the driver: map READWRITE instead (read_only_refused), or fail and map
  // nothing (memory that must never be writable by this process).
  bool read_write_fallback = true;
};

class VmmView {
 public:
  VmmView() = default;
  // Reserves chunk_bytes x chunk_count bytes of address space, aligned to the granularity.
  static Result<VmmView> Reserve(const PrimaryContext& ctx, uint64_t chunk_bytes,
                                 size_t chunk_count, size_t granularity);
  // Imports one fd per chunk (cuMemImportFromShareableHandle); the fds are closed after.
  Status Import(std::vector<UniqueFd> fds);
  // Uses the owner's chunk handles; `region` must outlive this view.
  Status Borrow(const VmmRegion& region);

  // Maps [offset, offset + bytes) of the region at base() + offset and grants access.
  // offset and bytes are multiples of chunk_bytes(); no chunk in the range may be mapped yet.
  Result<VmmMapStats> Map(uint64_t offset, uint64_t bytes, const VmmMapOptions& options);
  Result<VmmMapStats> MapAll(const VmmMapOptions& options) { return Map(0, bytes(), options); }
  // Unmaps the whole chunks in [offset, offset + bytes), which must all be mapped.
  Status Unmap(uint64_t offset, uint64_t bytes);
  // Sets the device's access to the whole chunks in [offset, offset + bytes), which must all
  // be mapped (one cuMemSetAccess; the mapping stays, and so does work that reads it).
  Status SetAccess(uint64_t offset, uint64_t bytes, VmmAccess access);
  void UnmapAll() { mappings_.clear(); }

  CUdeviceptr base() const { return range_.get(); }
  uint64_t bytes() const { return chunk_bytes_ * chunk_count_; }
  uint64_t chunk_bytes() const { return chunk_bytes_; }
  size_t chunk_count() const { return chunk_count_; }
  size_t granularity() const { return granularity_; }
  uint64_t mapped_bytes() const;
  bool has_chunks() const { return chunks_.size() == chunk_count_ && chunk_count_ > 0; }

 private:
  Status CheckRange(uint64_t offset, uint64_t bytes) const;

  const PrimaryContext* ctx_ = nullptr;
  uint64_t chunk_bytes_ = 0;
  size_t chunk_count_ = 0;
  size_t granularity_ = 0;
  // Destroyed in reverse order: mappings, then imported handles, then the reservation.
  AddressRange range_;
  std::vector<AllocationHandle> imported_;
  std::vector<const AllocationHandle*> chunks_;
  using Mappings = std::map<uint64_t, MappedRange>;
  // The mappings that make up [offset, offset + bytes) exactly: FailedPrecondition otherwise.
  Result<std::pair<Mappings::iterator, Mappings::iterator>> MappedRun(uint64_t offset,
                                                                      uint64_t bytes);
  Mappings mappings_;  // by offset
};

}  // namespace baton

#endif  // BATON_HAVE_CUDA_HEADERS
