#include "cuda/memory/pinned_host.h"

#ifdef BATON_HAVE_CUDA_HEADERS

#include <algorithm>

namespace baton {

const char* ToString(PinnedHostKind kind) {
  switch (kind) {
    case PinnedHostKind::kHostNuma:
      return "host_numa";
    case PinnedHostKind::kRegistered:
      return "registered";
    case PinnedHostKind::kPageable:
      return "pageable";
  }
  return "?";
}

bool ReadOnlyRegisterSupported(const PrimaryContext& ctx) {
  int supported = 0;
  return BATON_CU(ctx.driver(), cuDeviceGetAttribute, &supported,
                  CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED, ctx.device())
             .ok() &&
         supported != 0;
}

HostNumaSupport QueryHostNuma(const PrimaryContext& ctx) {
  HostNumaSupport out;
  const CudaDriver& cu = ctx.driver();
  int supported = 0;
  Status s =
      BATON_CU(cu, cuDeviceGetAttribute, &supported,
               CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, ctx.device());
  if (!s.ok()) {
    out.reason = "the driver does not report host-NUMA VMM support (" + s.message() + ")";
    return out;
  }
  if (supported == 0) {
    out.reason = "the device does not support host-NUMA VMM allocations";
    return out;
  }
  int node = -1;
  s = BATON_CU(cu, cuDeviceGetAttribute, &node, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, ctx.device());
  out.supported = true;
  out.numa_node = s.ok() && node >= 0 ? node : 0;  // -1: no NUMA on this host, node 0
  return out;
}

Result<PinnedHostCache> PinnedHostCache::CreateHostNuma(const PrimaryContext& ctx,
                                                        const PinnedHostOptions& options) {
  const TimePoint start = RealClock::Get().Now();
  const HostNumaSupport numa = QueryHostNuma(ctx);
  if (!numa.supported) return FailedPrecondition(numa.reason);
  PinnedHostCache cache;
  cache.kind_ = PinnedHostKind::kHostNuma;
  cache.numa_node_ = options.numa_node >= 0 ? options.numa_node : numa.numa_node;
  BATON_ASSIGN_OR_RETURN(cache.region_,
                         VmmRegion::Create(ctx, VmmRegionSpec{.name = "pinned-cache",
                                                              .bytes = options.bytes,
                                                              .chunk_bytes = options.chunk_bytes,
                                                              .location = VmmLocation::kHostNuma,
                                                              .numa_node = cache.numa_node_}));
  BATON_ASSIGN_OR_RETURN(
      cache.view_, VmmView::Reserve(ctx, cache.region_.chunk_bytes(), cache.region_.chunk_count(),
                                    cache.region_.granularity()));
  BATON_RETURN_IF_ERROR(cache.view_.Borrow(cache.region_));
  BATON_RETURN_IF_ERROR(cache.view_
                            .MapAll(VmmMapOptions{.access = VmmAccess::kReadWrite,
                                                  .host_numa_node = cache.numa_node_})
                            .status());
  cache.data_ = reinterpret_cast<uint8_t*>(cache.view_.base());
  cache.bytes_ = options.bytes;
  cache.copy_unit_ = cache.region_.chunk_bytes();  // a copy stays within one allocation
  cache.note_ = "cuMemCreate on host NUMA node " + std::to_string(cache.numa_node_);
  cache.setup_ms_ = MillisBetween(start, RealClock::Get().Now());
  return cache;
}

Result<PinnedHostCache> PinnedHostCache::Register(const PrimaryContext& ctx, uint8_t* data,
                                                  uint64_t bytes, uint64_t chunk_bytes,
                                                  bool read_only) {
  if (data == nullptr || bytes == 0 || chunk_bytes == 0) {
    return InvalidArgument("pinned host cache: nothing to register");
  }
  BATON_RETURN_IF_ERROR(ctx.MakeCurrent());
  if (read_only && !ReadOnlyRegisterSupported(ctx)) {
    return FailedPrecondition(
        "the range is mapped read-only and the device cannot register read-only host memory "
        "(CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED is 0)");
  }
  const unsigned flags =
      CU_MEMHOSTREGISTER_PORTABLE | (read_only ? CU_MEMHOSTREGISTER_READ_ONLY : 0u);
  const TimePoint start = RealClock::Get().Now();
  PinnedHostCache cache;
  cache.kind_ = PinnedHostKind::kRegistered;
  cache.read_only_ = read_only;
  for (uint64_t at = 0; at < bytes; at += chunk_bytes) {
    const uint64_t n = std::min(chunk_bytes, bytes - at);
    Result<HostRegistration> r = HostRegistration::Register(ctx.driver(), data + at, n, flags);
    if (!r.ok()) {
      return r.status().WithContext("registering host bytes [" + std::to_string(at) + ", +" +
                                    std::to_string(n) + ")");
    }
    cache.registrations_.push_back(std::move(r).value());
  }
  cache.data_ = data;
  cache.bytes_ = bytes;
  cache.copy_unit_ = std::min(chunk_bytes, bytes);
  cache.note_ =
      std::string(read_only ? "cuMemHostRegister (read-only) in " : "cuMemHostRegister in ") +
      std::to_string(cache.registrations_.size()) + " chunks";
  cache.setup_ms_ = MillisBetween(start, RealClock::Get().Now());
  return cache;
}

PinnedHostCache PinnedHostCache::Pageable(uint8_t* data, uint64_t bytes, const std::string& why) {
  PinnedHostCache cache;
  cache.kind_ = PinnedHostKind::kPageable;
  cache.data_ = data;
  cache.bytes_ = bytes;
  cache.copy_unit_ = bytes;
  cache.note_ = "not pinned (" + why + "): copied from pageable memory, staged by the driver";
  return cache;
}

Result<PinnedHostCache> PinnedHostCache::Create(const PrimaryContext& ctx,
                                                const PinnedHostOptions& options,
                                                std::span<uint8_t> fallback) {
  std::string why = "host-NUMA allocation not allowed by the configuration";
  if (options.allow_host_numa) {
    Result<PinnedHostCache> numa = CreateHostNuma(ctx, options);
    if (numa.ok()) return numa;
    why = numa.status().message();
  }
  if (fallback.size() < options.bytes) {
    return FailedPrecondition("no host-NUMA memory (" + why + ") and the fallback range holds " +
                              std::to_string(fallback.size()) + " of " +
                              std::to_string(options.bytes) + " bytes");
  }
  BATON_ASSIGN_OR_RETURN(PinnedHostCache cache,
                         Register(ctx, fallback.data(), options.bytes, options.chunk_bytes));
  cache.note_ += " (" + why + ")";
  return cache;
}

}  // namespace baton

#endif  // BATON_HAVE_CUDA_HEADERS
