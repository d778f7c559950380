#include "cuda/memory/vmm.h"

#ifdef BATON_HAVE_CUDA_HEADERS

#include <fcntl.h>

#include <cerrno>
#include <chrono>

#include "base/align.h"
#include "base/log.h"

namespace baton {
namespace {

double MsSince(TimePoint start) { return MillisBetween(start, RealClock::Get().Now()); }

}  // namespace

CUmemAllocationProp VmmChunkProp(const PrimaryContext& ctx, VmmLocation location, int numa_node) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  if (location == VmmLocation::kDevice) {
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = ctx.device();
  } else {
    prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
    prop.location.id = numa_node;
  }
  return prop;
}

Result<size_t> VmmGranularity(const PrimaryContext& ctx, VmmLocation location, int numa_node) {
  const CUmemAllocationProp prop = VmmChunkProp(ctx, location, numa_node);
  size_t granularity = 0;
  BATON_RETURN_IF_ERROR(BATON_CU(ctx.driver(), cuMemGetAllocationGranularity, &granularity, &prop,
                                 CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  if (granularity == 0) return Internal("cuMemGetAllocationGranularity returned 0");
  return granularity;
}

// --- VmmRegion --------------------------------------------------------------------------------

Result<VmmRegion> VmmRegion::Create(const PrimaryContext& ctx, const VmmRegionSpec& spec) {
  if (spec.bytes == 0 || spec.chunk_bytes == 0) {
    return InvalidArgument("VMM region '" + spec.name + "': bytes and chunk_bytes must be > 0");
  }
  BATON_RETURN_IF_ERROR(ctx.MakeCurrent());
  VmmRegion region;
  region.name_ = spec.name;
  region.location_ = spec.location;
  region.numa_node_ = spec.numa_node;
  BATON_ASSIGN_OR_RETURN(region.granularity_, VmmGranularity(ctx, spec.location, spec.numa_node));
  region.chunk_bytes_ = RoundUp(spec.chunk_bytes, region.granularity_);
  const uint64_t count = RoundUp(spec.bytes, region.chunk_bytes_) / region.chunk_bytes_;
  const CUmemAllocationProp prop = VmmChunkProp(ctx, spec.location, spec.numa_node);
  region.chunks_.reserve(count);
  for (uint64_t i = 0; i < count; ++i) {
    Result<AllocationHandle> chunk =
        AllocationHandle::Create(ctx.driver(), prop, region.chunk_bytes_);
    if (!chunk.ok()) {
      return chunk.status().WithContext("VMM region '" + spec.name + "' chunk " +
                                        std::to_string(i) + " of " + std::to_string(count) + " (" +
                                        std::to_string(region.chunk_bytes_) + " bytes)");
    }
    region.chunks_.push_back(std::move(chunk).value());
  }
  return region;
}

Result<VmmRegion> VmmRegion::Import(const PrimaryContext& ctx, std::string name,
                                    uint64_t chunk_bytes, std::vector<UniqueFd> fds,
                                    VmmLocation location, int numa_node) {
  if (fds.empty() || chunk_bytes == 0) {
    return InvalidArgument("VMM region '" + name + "': no chunks to import");
  }
  BATON_RETURN_IF_ERROR(ctx.MakeCurrent());
  VmmRegion region;
  region.name_ = std::move(name);
  region.location_ = location;
  region.numa_node_ = numa_node;
  BATON_ASSIGN_OR_RETURN(region.granularity_, VmmGranularity(ctx, location, numa_node));
  if (chunk_bytes % region.granularity_ != 0) {
    return InvalidArgument("VMM region '" + region.name_ + "': chunk_bytes " +
                           std::to_string(chunk_bytes) + " is not a multiple of the granularity " +
                           std::to_string(region.granularity_));
  }
  region.chunk_bytes_ = chunk_bytes;
  region.chunks_.reserve(fds.size());
  for (size_t i = 0; i < fds.size(); ++i) {
    Result<AllocationHandle> chunk = AllocationHandle::Import(ctx.driver(), fds[i].get());
    if (!chunk.ok()) {
      return chunk.status().WithContext("importing VMM region '" + region.name_ + "' chunk " +
                                        std::to_string(i) + " of " + std::to_string(fds.size()));
    }
    region.chunks_.push_back(std::move(chunk).value());
  }
  region.imported_fds_ = std::move(fds);
  return region;
}

Result<std::vector<UniqueFd>> VmmRegion::ExportAll() const {
  std::vector<UniqueFd> fds;
  fds.reserve(chunks_.size());
  if (!imported_fds_.empty()) {
    for (size_t i = 0; i < imported_fds_.size(); ++i) {
      const int fd = ::fcntl(imported_fds_[i].get(), F_DUPFD_CLOEXEC, 0);
      if (fd < 0) {
        return ErrnoStatus("dup of '" + name_ + "' chunk " + std::to_string(i), errno);
      }
      fds.emplace_back(fd);
    }
    return fds;
  }
  for (size_t i = 0; i < chunks_.size(); ++i) {
    Result<UniqueFd> fd = chunks_[i].Export();
    if (!fd.ok()) {
      return fd.status().WithContext("exporting '" + name_ + "' chunk " + std::to_string(i));
    }
    fds.push_back(std::move(fd).value());
  }
  return fds;
}

// --- VmmView ----------------------------------------------------------------------------------

Result<VmmView> VmmView::Reserve(const PrimaryContext& ctx, uint64_t chunk_bytes,
                                 size_t chunk_count, size_t granularity) {
  if (chunk_count == 0 || granularity == 0 || chunk_bytes == 0 || chunk_bytes % granularity != 0) {
    return InvalidArgument("VMM view: chunk_bytes " + std::to_string(chunk_bytes) +
                           " is not a positive multiple of the granularity " +
                           std::to_string(granularity) + " (or no chunks)");
  }
  BATON_RETURN_IF_ERROR(ctx.MakeCurrent());
  VmmView view;
  view.ctx_ = &ctx;
  view.chunk_bytes_ = chunk_bytes;
  view.chunk_count_ = chunk_count;
  view.granularity_ = granularity;
  BATON_ASSIGN_OR_RETURN(
      view.range_, AddressRange::Reserve(ctx.driver(), chunk_bytes * chunk_count, granularity));
  return view;
}

Status VmmView::Import(std::vector<UniqueFd> fds) {
  if (!chunks_.empty()) return FailedPrecondition("VMM view already has its chunks");
  if (fds.size() != chunk_count_) {
    return InvalidArgument("VMM view expects " + std::to_string(chunk_count_) + " chunk fds, got " +
                           std::to_string(fds.size()));
  }
  BATON_RETURN_IF_ERROR(ctx_->MakeCurrent());
  std::vector<AllocationHandle> imported;
  imported.reserve(fds.size());
  for (size_t i = 0; i < fds.size(); ++i) {
    Result<AllocationHandle> h = AllocationHandle::Import(ctx_->driver(), fds[i].get());
    if (!h.ok()) return h.status().WithContext("importing chunk " + std::to_string(i));
    imported.push_back(std::move(h).value());
    fds[i].Reset();  // the import holds its own reference
  }
  imported_ = std::move(imported);
  for (const AllocationHandle& h : imported_) chunks_.push_back(&h);
  return OkStatus();
}

Status VmmView::Borrow(const VmmRegion& region) {
  if (!chunks_.empty()) return FailedPrecondition("VMM view already has its chunks");
  if (region.chunk_count() != chunk_count_ || region.chunk_bytes() != chunk_bytes_) {
    return InvalidArgument("VMM view does not match region '" + region.name() + "'");
  }
  for (size_t i = 0; i < region.chunk_count(); ++i) chunks_.push_back(&region.chunk(i));
  return OkStatus();
}

Status VmmView::CheckRange(uint64_t offset, uint64_t bytes) const {
  if (bytes == 0 || offset % granularity_ != 0 || bytes % granularity_ != 0 ||
      offset > this->bytes() || bytes > this->bytes() - offset) {
    return InvalidArgument("VMM range [" + std::to_string(offset) + ", +" + std::to_string(bytes) +
                           ") is not granularity-aligned inside the " +
                           std::to_string(this->bytes()) + "-byte view");
  }
  return OkStatus();
}

Result<VmmMapStats> VmmView::Map(uint64_t offset, uint64_t bytes, const VmmMapOptions& options) {
  BATON_RETURN_IF_ERROR(CheckRange(offset, bytes));
  if (offset % chunk_bytes_ != 0 || bytes % chunk_bytes_ != 0) {
    return InvalidArgument("VMM views map whole chunks of " + std::to_string(chunk_bytes_) +
                           " bytes (cuMemMap takes offset 0 only); [" + std::to_string(offset) +
                           ", +" + std::to_string(bytes) + ") is not whole chunks");
  }
  if (!has_chunks()) return FailedPrecondition("VMM view has no chunks to map (Import first)");
  for (uint64_t at = offset; at < offset + bytes; at += chunk_bytes_) {
    if (mappings_.count(at) != 0) {
      return FailedPrecondition("VMM chunk at offset " + std::to_string(at) + " is already mapped");
    }
  }
  BATON_RETURN_IF_ERROR(ctx_->MakeCurrent());
  const CudaDriver& cu = ctx_->driver();
  VmmMapStats stats;
  std::vector<std::pair<uint64_t, MappedRange>> made;
  TimePoint start = RealClock::Get().Now();
  for (uint64_t at = offset; at < offset + bytes; at += chunk_bytes_) {
    BATON_ASSIGN_OR_RETURN(MappedRange m, MappedRange::Map(cu, base() + at, chunk_bytes_, 0,
                                                           *chunks_[at / chunk_bytes_]));
    made.emplace_back(at, std::move(m));
    ++stats.map_calls;
  }
  stats.map_ms = MsSince(start);

  start = RealClock::Get().Now();
  CUmemAccessDesc desc = {};
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = ctx_->device();
  desc.flags = options.access == VmmAccess::kRead ? CU_MEM_ACCESS_FLAGS_PROT_READ
                                                  : CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  Status access = BATON_CU(cu, cuMemSetAccess, base() + offset, bytes, &desc, 1);
  if (!access.ok() && options.access == VmmAccess::kRead && options.read_write_fallback) {
    desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (BATON_CU(cu, cuMemSetAccess, base() + offset, bytes, &desc, 1).ok()) {
      BATON_LOG(WARN, "cuda") << "the driver refused read-only access (" << access.message()
                              << "); the range is mapped read-write";
      stats.read_only_refused = true;
      access = OkStatus();
    }
  }
  BATON_RETURN_IF_ERROR(access);
  if (options.host_numa_node >= 0) {
    desc.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
    desc.location.id = options.host_numa_node;
    BATON_RETURN_IF_ERROR(
        BATON_CU(cu, cuMemSetAccess, base() + offset, bytes, &desc, 1).WithContext("CPU access"));
  }
  stats.access_ms = MsSince(start);
  for (auto& [at, m] : made) mappings_.emplace(at, std::move(m));
  return stats;
}

Status VmmView::Unmap(uint64_t offset, uint64_t bytes) {
  BATON_ASSIGN_OR_RETURN(const auto run, MappedRun(offset, bytes));
  BATON_RETURN_IF_ERROR(ctx_->MakeCurrent());
  mappings_.erase(run.first, run.second);
  return OkStatus();
}

Status VmmView::SetAccess(uint64_t offset, uint64_t bytes, VmmAccess access) {
  BATON_RETURN_IF_ERROR(MappedRun(offset, bytes).status());
  BATON_RETURN_IF_ERROR(ctx_->MakeCurrent());
  CUmemAccessDesc desc = {};
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = ctx_->device();
  desc.flags = access == VmmAccess::kRead ? CU_MEM_ACCESS_FLAGS_PROT_READ
                                          : CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return BATON_CU(ctx_->driver(), cuMemSetAccess, base() + offset, bytes, &desc, 1);
}

Result<std::pair<VmmView::Mappings::iterator, VmmView::Mappings::iterator>> VmmView::MappedRun(
    uint64_t offset, uint64_t bytes) {
  BATON_RETURN_IF_ERROR(CheckRange(offset, bytes));
  auto first = mappings_.find(offset);
  if (first == mappings_.end()) {
    return FailedPrecondition("no VMM mapping starts at offset " + std::to_string(offset));
  }
  auto it = first;
  uint64_t at = offset;
  while (at < offset + bytes) {
    if (it == mappings_.end() || it->first != at) {
      return FailedPrecondition("VMM range [" + std::to_string(offset) + ", +" +
                                std::to_string(bytes) + ") is not a run of mapped chunks");
    }
    at += it->second.bytes();
    ++it;
  }
  if (at != offset + bytes) {
    return FailedPrecondition("VMM range [" + std::to_string(offset) + ", +" +
                              std::to_string(bytes) + ") ends inside a chunk");
  }
  return std::make_pair(first, it);
}

uint64_t VmmView::mapped_bytes() const {
  uint64_t total = 0;
  for (const auto& [at, m] : mappings_) total += m.bytes();
  return total;
}

}  // namespace baton

#endif  // BATON_HAVE_CUDA_HEADERS
