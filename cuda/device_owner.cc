#include "cuda/device_owner.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <sstream>

#include "base/align.h"
#include "base/log.h"
#include "cuda/device_session.h"
#include "cuda/memory/vmm_share.h"

#ifdef BATON_HAVE_CUDA_HEADERS
#include "cuda/driver/cuda_driver.h"
#include "cuda/memory/pinned_host.h"
#include "cuda/memory/rematerializer.h"
#include "cuda/memory/vmm.h"
#endif

namespace baton {

Result<uint64_t> PoolChunkBytes(uint64_t block_bytes, uint64_t granularity, uint64_t pool_bytes,
                                uint64_t limit) {
  if (block_bytes == 0 || granularity == 0 || pool_bytes == 0) {
    return InvalidArgument("pool chunk: block size, granularity and pool must be positive");
  }
  const uint64_t unit = std::lcm(block_bytes, granularity);
  const uint64_t whole_pool = (pool_bytes + unit - 1) / unit * unit;
  return std::min(std::max<uint64_t>(1, limit / unit) * unit, whole_pool);
}

const char* ToString(HostPin pin) {
  switch (pin) {
    case HostPin::kNotNeeded:
      return "not_needed";
    case HostPin::kPinned:
      return "registered";
    case HostPin::kReadOnly:
      return "registered_read_only";
    case HostPin::kPageable:
      return "pageable";
  }
  return "?";
}

#ifdef BATON_HAVE_CUDA_HEADERS

struct DeviceOwner::Impl {
  // Destroyed bottom-up: the view and regions before the pinned cache and the context.
  PrimaryContext ctx;
  PinnedHostCache pinned;
  VmmRegion weights;
  VmmView weights_view;  // the owner's own read-write window, for rematerialization
  VmmRegion pool;
  Stream probe_stream;          // the health probe's own stream
  PinnedHostBuffer probe_word;  // where it copies to, pinned so the copy is asynchronous
  std::span<uint8_t> arena;
  bool arena_read_only = false;
  int remat_streams = 4;
};

namespace {
// The arena is registered in pieces of this size: each registration stays bounded, and the
// copies from it are cut at their ends.
constexpr uint64_t kPinChunkBytes = 1ull << 30;
}  // namespace

DeviceOwner::DeviceOwner() : impl_(std::make_unique<Impl>()) {}
// The context is made current first: unregistering host memory and freeing pinned buffers
// need it on the destroying thread, which need not be the one that made them.
DeviceOwner::~DeviceOwner() {
  if (impl_ != nullptr && impl_->ctx.get() != nullptr) (void)impl_->ctx.MakeCurrent();
}

namespace {

Status ShareRegion(proto::Channel& channel, const VmmRegion& region, bool writable) {
  BATON_ASSIGN_OR_RETURN(std::vector<UniqueFd> fds, region.ExportAll());
  std::vector<int> raw;
  for (const UniqueFd& fd : fds) raw.push_back(fd.get());
  return SendVmmRegion(channel,
                       VmmRegionInfo{.name = region.name(),
                                     .chunk_bytes = region.chunk_bytes(),
                                     .chunk_count = static_cast<uint32_t>(region.chunk_count()),
                                     .writable = writable},
                       raw);
}

}  // namespace

Result<std::unique_ptr<DeviceOwner>> DeviceOwner::Begin(const DeviceOwnerOptions& options,
                                                        std::span<uint8_t> arena) {
  if (arena.empty() || options.block_count == 0 || options.block_bytes == 0) {
    return InvalidArgument("device memory: an empty weight arena or pool");
  }
  BATON_ASSIGN_OR_RETURN(const CudaDriver* driver, CudaDriver::Get());
  std::unique_ptr<DeviceOwner> o(new DeviceOwner());
  Impl& m = *o->impl_;
  o->device_ = options.device;
  m.arena = arena;
  m.arena_read_only = options.arena_read_only;
  m.remat_streams = options.remat_streams;
  BATON_ASSIGN_OR_RETURN(m.ctx, PrimaryContext::Retain(*driver, options.device));
  char bus_id[32] = {};
  BATON_RETURN_IF_ERROR(
      BATON_CU(*driver, cuDeviceGetPCIBusId, bus_id, sizeof(bus_id) - 1, m.ctx.device()));
  o->pci_bus_id_ = bus_id;
  return o;
}

void DeviceOwner::PinArena() {
  Impl& m = *impl_;
  if (m.pinned.data() != nullptr) return;
  Result<PinnedHostCache> pinned = PinnedHostCache::Register(m.ctx, m.arena.data(), m.arena.size(),
                                                             kPinChunkBytes, m.arena_read_only);
  if (pinned.ok()) {
    m.pinned = std::move(pinned).value();
    stats_.pin = m.arena_read_only ? HostPin::kReadOnly : HostPin::kPinned;
  } else {
    BATON_LOG(WARN, "cuda") << "the weight arena is not pinned (" << pinned.status().message()
                            << "): the device copy is made from pageable memory, more slowly";
    m.pinned = PinnedHostCache::Pageable(m.arena.data(), m.arena.size(), pinned.status().message());
    stats_.pin = HostPin::kPageable;
  }
  stats_.pinned = m.pinned.note();
  stats_.pin_ms = m.pinned.setup_ms();
}

Status DeviceOwner::Finish() {
  Impl& m = *impl_;
  BATON_ASSIGN_OR_RETURN(m.weights_view,
                         VmmView::Reserve(m.ctx, m.weights.chunk_bytes(), m.weights.chunk_count(),
                                          m.weights.granularity()));
  BATON_RETURN_IF_ERROR(m.weights_view.Borrow(m.weights));
  BATON_RETURN_IF_ERROR(m.weights_view.MapAll({.access = VmmAccess::kReadWrite}).status());
  BATON_ASSIGN_OR_RETURN(m.probe_stream, Stream::Create(m.ctx.driver()));
  BATON_ASSIGN_OR_RETURN(m.probe_word,
                         PinnedHostBuffer::Allocate(m.ctx.driver(), sizeof(uint32_t)));
  stats_.weights_bytes = m.weights.bytes();
  stats_.weights_chunks = static_cast<uint32_t>(m.weights.chunk_count());
  stats_.pool_bytes = m.pool.bytes();
  stats_.pool_chunk_bytes = m.pool.chunk_bytes();
  stats_.pool_chunks = static_cast<uint32_t>(m.pool.chunk_count());
  return OkStatus();
}

Result<std::unique_ptr<DeviceOwner>> DeviceOwner::Create(const DeviceOwnerOptions& options,
                                                         std::span<uint8_t> arena) {
  BATON_ASSIGN_OR_RETURN(std::unique_ptr<DeviceOwner> o, Begin(options, arena));
  Impl& m = *o->impl_;
  // Small weight sets take one chunk of their own size (rounded up to the granularity).
  const uint64_t weights_chunk = std::min<uint64_t>(options.weights_chunk_bytes, arena.size());
  BATON_ASSIGN_OR_RETURN(m.weights, VmmRegion::Create(m.ctx, {.name = kDeviceWeightsRegion,
                                                              .bytes = arena.size(),
                                                              .chunk_bytes = weights_chunk}));
  BATON_ASSIGN_OR_RETURN(size_t granularity, VmmGranularity(m.ctx, VmmLocation::kDevice, 0));
  const uint64_t pool_bytes = uint64_t{options.block_count} * options.block_bytes;
  BATON_ASSIGN_OR_RETURN(uint64_t chunk, PoolChunkBytes(options.block_bytes, granularity,
                                                        pool_bytes, options.pool_chunk_bytes));
  BATON_ASSIGN_OR_RETURN(
      m.pool, VmmRegion::Create(
                  m.ctx, {.name = kDevicePoolRegion, .bytes = pool_bytes, .chunk_bytes = chunk}));
  if (m.pool.bytes() > pool_bytes + pool_bytes / 4) {
    BATON_LOG(WARN, "cuda") << "device pool: " << pool_bytes << " bytes of blocks take "
                            << m.pool.bytes() << " bytes in chunks of " << chunk << " (block size "
                            << options.block_bytes << " and granularity " << granularity
                            << " have a large common multiple); a block size that is a multiple "
                               "of the granularity wastes nothing";
  }
  BATON_RETURN_IF_ERROR(o->Finish());
  BATON_RETURN_IF_ERROR(o->Rematerialize());
  return o;
}

Result<std::unique_ptr<DeviceOwner>> DeviceOwner::Adopt(const DeviceOwnerOptions& options,
                                                        std::span<uint8_t> arena,
                                                        KeptDeviceMemory kept,
                                                        uint32_t verify_samples) {
  BATON_ASSIGN_OR_RETURN(std::unique_ptr<DeviceOwner> o, Begin(options, arena));
  Impl& m = *o->impl_;
  BATON_ASSIGN_OR_RETURN(size_t granularity, VmmGranularity(m.ctx, VmmLocation::kDevice, 0));
  const uint64_t weights_chunk =
      RoundUp(std::min<uint64_t>(options.weights_chunk_bytes, arena.size()), uint64_t{granularity});
  const uint64_t pool_bytes = uint64_t{options.block_count} * options.block_bytes;
  BATON_ASSIGN_OR_RETURN(uint64_t pool_chunk, PoolChunkBytes(options.block_bytes, granularity,
                                                             pool_bytes, options.pool_chunk_bytes));
  const auto chunks = [](uint64_t bytes, uint64_t chunk) { return (bytes + chunk - 1) / chunk; };
  if (kept.weights.chunk_bytes != weights_chunk ||
      kept.weights.fds.size() != chunks(arena.size(), weights_chunk)) {
    return FailedPrecondition(
        "the kept device weights are " + std::to_string(kept.weights.fds.size()) + " chunks of " +
        std::to_string(kept.weights.chunk_bytes) + " bytes, this arena takes " +
        std::to_string(chunks(arena.size(), weights_chunk)) + " of " +
        std::to_string(weights_chunk));
  }
  if (kept.pool.chunk_bytes != pool_chunk ||
      kept.pool.fds.size() != chunks(pool_bytes, pool_chunk)) {
    return FailedPrecondition(
        "the kept device pool is " + std::to_string(kept.pool.fds.size()) + " chunks of " +
        std::to_string(kept.pool.chunk_bytes) + " bytes, this pool takes " +
        std::to_string(chunks(pool_bytes, pool_chunk)) + " of " + std::to_string(pool_chunk));
  }
  BATON_ASSIGN_OR_RETURN(m.weights, VmmRegion::Import(m.ctx, kDeviceWeightsRegion, weights_chunk,
                                                      std::move(kept.weights.fds)));
  BATON_ASSIGN_OR_RETURN(
      m.pool, VmmRegion::Import(m.ctx, kDevicePoolRegion, pool_chunk, std::move(kept.pool.fds)));
  BATON_RETURN_IF_ERROR(o->Finish().WithContext("mapping the kept device weights"));
  {  // every pool chunk maps at its size; the owner keeps no mapping of the pool
    BATON_ASSIGN_OR_RETURN(VmmView pool_view, VmmView::Reserve(m.ctx, m.pool.chunk_bytes(),
                                                               m.pool.chunk_count(), granularity));
    BATON_RETURN_IF_ERROR(pool_view.Borrow(m.pool));
    BATON_RETURN_IF_ERROR(pool_view.MapAll({.access = VmmAccess::kReadWrite})
                              .status()
                              .WithContext("mapping the kept device pool"));
  }
  BATON_RETURN_IF_ERROR(o->VerifyWeights(verify_samples));
  BATON_RETURN_IF_ERROR(o->Probe(std::chrono::seconds(2)));
  o->stats_.adopted = true;
  o->stats_.pin = HostPin::kNotNeeded;
  o->stats_.pinned =
      "not pinned: the device copy was adopted and nothing is copied (a lost device copy is "
      "rebuilt by a new owner, which pins the arena then)";
  return o;
}

Status DeviceOwner::VerifyWeights(uint32_t samples) const {
  const Impl& m = *impl_;
  const size_t window = std::min<size_t>(4096, m.arena.size());
  BATON_ASSIGN_OR_RETURN(PinnedHostBuffer buffer,
                         PinnedHostBuffer::Allocate(m.ctx.driver(), window));
  const uint64_t last = m.arena.size() - window;
  const uint32_t n = std::max<uint32_t>(samples, 2);
  for (uint32_t i = 0; i < n; ++i) {
    const uint64_t at = last * i / (n - 1);
    BATON_RETURN_IF_ERROR(BATON_CU(m.ctx.driver(), cuMemcpyDtoHAsync, buffer.data(),
                                   m.weights_view.base() + at, window, m.probe_stream.get()));
    BATON_RETURN_IF_ERROR(m.probe_stream.Synchronize(std::chrono::seconds(2)));
    if (std::memcmp(buffer.data(), m.arena.data() + at, window) != 0) {
      return FailedPrecondition("the kept device weights differ from the arena at byte " +
                                std::to_string(at));
    }
  }
  return OkStatus();
}

Result<KeptDeviceMemory> DeviceOwner::ExportForKeeping() const {
  KeptDeviceMemory kept;
  kept.weights.chunk_bytes = impl_->weights.chunk_bytes();
  BATON_ASSIGN_OR_RETURN(kept.weights.fds, impl_->weights.ExportAll());
  kept.pool.chunk_bytes = impl_->pool.chunk_bytes();
  BATON_ASSIGN_OR_RETURN(kept.pool.fds, impl_->pool.ExportAll());
  return kept;
}

Status DeviceOwner::Rematerialize() {
  Impl& m = *impl_;
  PinArena();
  BATON_ASSIGN_OR_RETURN(Rematerializer remat,
                         Rematerializer::Create(m.ctx, {.streams = m.remat_streams}));
  BATON_ASSIGN_OR_RETURN(CopyStats copied, remat.Copy(m.weights_view.base(), m.pinned.data(),
                                                      m.arena.size(), m.pinned.copy_unit()));
  stats_.remat_ms = copied.ms;
  stats_.remat_gbps = copied.gbps;
  stats_.copied_bytes += copied.bytes;
  return OkStatus();
}

Status DeviceOwner::Probe(Duration timeout) const {
  const Impl& m = *impl_;
  BATON_RETURN_IF_ERROR(m.ctx.MakeCurrent());
  BATON_RETURN_IF_ERROR(BATON_CU(m.ctx.driver(), cuMemcpyDtoHAsync, m.probe_word.data(),
                                 m.weights_view.base(), sizeof(uint32_t), m.probe_stream.get())
                            .WithContext("device probe"));
  return m.probe_stream.Synchronize(timeout).WithContext("device probe");
}

Status DeviceOwner::Share(proto::Channel& channel) const {
  BATON_RETURN_IF_ERROR(ShareRegion(channel, impl_->weights, /*writable=*/false));
  return ShareRegion(channel, impl_->pool, /*writable=*/true);
}

#else  // !BATON_HAVE_CUDA_HEADERS

struct DeviceOwner::Impl {};
DeviceOwner::DeviceOwner() : impl_(std::make_unique<Impl>()) {}
DeviceOwner::~DeviceOwner() = default;

Result<std::unique_ptr<DeviceOwner>> DeviceOwner::Create(const DeviceOwnerOptions&,
                                                         std::span<uint8_t>) {
  return Unimplemented("CUDA backend not compiled (built without the CUDA toolkit headers)");
}
Result<std::unique_ptr<DeviceOwner>> DeviceOwner::Adopt(const DeviceOwnerOptions&,
                                                        std::span<uint8_t>, KeptDeviceMemory,
                                                        uint32_t) {
  return Unimplemented("CUDA backend not compiled (built without the CUDA toolkit headers)");
}
Result<KeptDeviceMemory> DeviceOwner::ExportForKeeping() const {
  return Unimplemented("no device memory");
}

Status DeviceOwner::Share(proto::Channel&) const { return Unimplemented("no device memory"); }
Status DeviceOwner::Rematerialize() { return Unimplemented("no device memory"); }
Status DeviceOwner::Probe(Duration) const { return Unimplemented("no device memory"); }

#endif

std::string DeviceOwner::Describe() const {
  std::ostringstream out;
  out.precision(3);
  out << "device " << device_ << ": weights " << stats_.weights_bytes << " bytes in "
      << stats_.weights_chunks << " chunks (";
  if (stats_.adopted) {
    out << "adopted from baton-keeper, not copied; host cache " << stats_.pinned;
  } else {
    out << "host cache " << (stats_.pin == HostPin::kPageable ? "" : "pinned by ") << stats_.pinned
        << " in " << stats_.pin_ms << " ms, ";
    out << "copied in " << stats_.remat_ms << " ms at " << stats_.remat_gbps << " GB/s";
  }
  out << "), pool " << stats_.pool_bytes << " bytes in " << stats_.pool_chunks << " chunks of "
      << stats_.pool_chunk_bytes << " bytes" << (stats_.adopted ? ", adopted" : "");
  return out.str();
}

}  // namespace baton
