#include "cuda/device_borrower.h"

#ifdef BATON_HAVE_CUDA_HEADERS

#include "base/log.h"
#include "cuda/memory/vmm_share.h"

namespace baton {
namespace {

double MsSince(TimePoint start) { return MillisBetween(start, RealClock::Get().Now()); }

}  // namespace

Result<std::unique_ptr<DeviceBorrower>> DeviceBorrower::Create(const CudaDriver& driver,
                                                               int device) {
  std::unique_ptr<DeviceBorrower> b(new DeviceBorrower());
  BATON_ASSIGN_OR_RETURN(b->ctx_, PrimaryContext::Retain(driver, device));
  BATON_ASSIGN_OR_RETURN(b->kernels_, Kernels::Load(b->ctx_));
  BATON_ASSIGN_OR_RETURN(b->stream_, Stream::Create(driver));
  return b;
}

DeviceBorrower::~DeviceBorrower() {
  if (ctx_.get() != nullptr) (void)ctx_.MakeCurrent();  // for the members' release calls
  if (stream_.valid()) (void)stream_.Synchronize(std::chrono::seconds(5));
}

Result<AcceptedRegion> DeviceBorrower::AcceptRegion(proto::Channel& channel, Duration timeout) {
  BATON_ASSIGN_OR_RETURN(ReceivedVmmRegion received, ReceiveVmmRegion(channel, timeout));
  const std::string name = received.info.name;
  Result<AcceptedRegion> taken = TakeRegion(std::move(received));
  BATON_RETURN_IF_ERROR(AckVmmRegion(channel, name, taken.status()));
  return taken;
}

Result<AcceptedRegion> DeviceBorrower::TakeRegion(ReceivedVmmRegion received) {
  const VmmRegionInfo info = received.info;
  AcceptedRegion out{.name = info.name,
                     .writable = info.writable,
                     .bytes = info.chunk_bytes * info.chunk_count,
                     .chunks = info.chunk_count};
  auto take = [&]() -> Status {
    if (views_.count(info.name) != 0) {
      return FailedPrecondition("region '" + info.name + "' was already accepted");
    }
    BATON_ASSIGN_OR_RETURN(size_t granularity,
                           VmmGranularity(ctx_, VmmLocation::kDevice, /*numa_node=*/0));
    const TimePoint start = RealClock::Get().Now();
    BATON_ASSIGN_OR_RETURN(VmmView view,
                           VmmView::Reserve(ctx_, info.chunk_bytes, info.chunk_count, granularity));
    BATON_RETURN_IF_ERROR(view.Import(std::move(received.fds)));
    out.import_ms = MsSince(start);
    if (!info.writable) {
      const TimePoint map_start = RealClock::Get().Now();
      BATON_ASSIGN_OR_RETURN(VmmMapStats mapped,
                             view.MapAll(VmmMapOptions{.access = VmmAccess::kRead}));
      out.map_ms = MsSince(map_start);
      out.read_only = !mapped.read_only_refused;
    }
    views_.emplace(info.name, std::move(view));
    return OkStatus();
  };
  BATON_RETURN_IF_ERROR(take().WithContext("region '" + info.name + "'"));
  BATON_LOG(INFO, "cuda") << "region '" << info.name << "': " << info.chunk_count << " chunks of "
                          << info.chunk_bytes << " bytes imported in " << out.import_ms << " ms"
                          << (info.writable   ? ", range reserved"
                              : out.read_only ? ", mapped read-only in "
                                              : ", mapped read-write (read-only refused) in ")
                          << (info.writable ? "" : std::to_string(out.map_ms) + " ms");
  return out;
}

Result<PromotionPhases> DeviceBorrower::Promote(const std::string& name, uint64_t block_bytes,
                                                uint32_t header_bytes, Duration timeout) {
  const TimePoint start = RealClock::Get().Now();
  VmmView* pool = view(name);
  if (pool == nullptr) return NotFound("no region '" + name + "' to promote onto");
  if (block_bytes == 0 || pool->bytes() % block_bytes != 0) {
    return InvalidArgument("block_bytes " + std::to_string(block_bytes) +
                           " does not divide region '" + name + "'");
  }
  BATON_RETURN_IF_ERROR(ctx_.MakeCurrent());
  BATON_ASSIGN_OR_RETURN(VmmMapStats mapped,
                         pool->MapAll(VmmMapOptions{.access = VmmAccess::kReadWrite}));
  PromotionPhases phases{.map_calls = mapped.map_calls,
                         .map_ms = mapped.map_ms,
                         .access_ms = mapped.access_ms,
                         .blocks = static_cast<uint32_t>(pool->bytes() / block_bytes)};
  const TimePoint scrub_start = RealClock::Get().Now();
  BATON_RETURN_IF_ERROR(
      kernels_.ScrubHeaders(stream_, pool->base(), block_bytes, header_bytes, phases.blocks));
  BATON_RETURN_IF_ERROR(stream_.Synchronize(timeout).WithContext("header scrub"));
  phases.scrub_ms = MsSince(scrub_start);
  phases.total_ms = MsSince(start);
  return phases;
}

Result<ChunkCover*> DeviceBorrower::CoverOf(const std::string& name, const VmmView& pool,
                                            uint64_t block_bytes, uint32_t block_count) {
  auto cover = covers_.find(name);
  if (cover != covers_.end()) return &cover->second;
  if (block_bytes == 0 || pool.chunk_bytes() % block_bytes != 0) {
    return InvalidArgument("block_bytes " + std::to_string(block_bytes) +
                           " does not divide the chunks of region '" + name + "'");
  }
  BATON_ASSIGN_OR_RETURN(
      ChunkCover made,
      ChunkCover::Create(block_count, static_cast<uint32_t>(pool.chunk_bytes() / block_bytes),
                         static_cast<uint32_t>(pool.chunk_count())));
  return &covers_.emplace(name, std::move(made)).first->second;
}

namespace {

uint64_t OffsetOf(const VmmView& pool, const ChunkSpan& s) {
  return uint64_t{s.first} * pool.chunk_bytes();
}
uint64_t BytesOf(const VmmView& pool, const ChunkSpan& s) {
  return uint64_t{s.count} * pool.chunk_bytes();
}

// Undoes a MapBlocks() that failed: the chunks it mapped are unmapped, the blocks are no
// longer held, and the chunks it made writable are counted as read again (at READ access
// where the driver takes it), for DropReadOnly() to unmap.
void UndoMapBlocks(VmmView& pool, ChunkCover& cover, uint32_t first, uint32_t count,
                   const std::vector<ChunkSpan>& mapped, const std::vector<ChunkSpan>& upgraded) {
  for (const ChunkSpan& s : mapped) (void)pool.Unmap(OffsetOf(pool, s), BytesOf(pool, s));
  (void)cover.Remove(first, count);
  for (const ChunkSpan& s : upgraded) {
    // Back to READ, or unmapped where the driver will not (never writable with no block held).
    if (!pool.SetAccess(OffsetOf(pool, s), BytesOf(pool, s), VmmAccess::kRead).ok()) {
      (void)pool.Unmap(OffsetOf(pool, s), BytesOf(pool, s));
      continue;
    }
    for (uint32_t c = s.first; c < s.first + s.count; ++c) {
      (void)cover.AddReadOnly(c * cover.blocks_per_chunk(), 1);
    }
  }
}

}  // namespace

Result<PromotionPhases> DeviceBorrower::MapBlocks(const std::string& name, uint32_t first,
                                                  uint32_t count, uint64_t block_bytes,
                                                  uint32_t block_count, uint32_t header_bytes,
                                                  Duration timeout) {
  const TimePoint start = RealClock::Get().Now();
  VmmView* pool = view(name);
  if (pool == nullptr) return NotFound("no region '" + name + "' to map blocks of");
  BATON_RETURN_IF_ERROR(ctx_.MakeCurrent());
  BATON_ASSIGN_OR_RETURN(ChunkCover * cover, CoverOf(name, *pool, block_bytes, block_count));
  std::vector<ChunkSpan> upgraded;
  BATON_ASSIGN_OR_RETURN(std::vector<ChunkSpan> spans, cover->Add(first, count, &upgraded));
  PromotionPhases phases{.blocks = count};
  // Chunks read for a copy until now: made writable in place, so that a copy still reading
  // them goes on undisturbed (an unmap under a running kernel faults it).
  std::vector<ChunkSpan> mapped;
  for (const ChunkSpan& s : upgraded) {
    Status writable = pool->SetAccess(OffsetOf(*pool, s), BytesOf(*pool, s), VmmAccess::kReadWrite);
    if (!writable.ok()) {
      UndoMapBlocks(*pool, *cover, first, count, mapped, upgraded);
      return writable.WithContext("making chunks mapped for reading writable");
    }
  }
  for (const ChunkSpan& s : spans) {
    Result<VmmMapStats> m =
        pool->Map(OffsetOf(*pool, s), BytesOf(*pool, s), {.access = VmmAccess::kReadWrite});
    if (!m.ok()) {
      UndoMapBlocks(*pool, *cover, first, count, mapped, upgraded);
      return m.status();
    }
    mapped.push_back(s);
    phases.map_calls += m->map_calls;
    phases.map_ms += m->map_ms;
    phases.access_ms += m->access_ms;
  }
  const TimePoint scrub_start = RealClock::Get().Now();
  Status scrubbed = kernels_.ScrubHeaders(stream_, pool->base() + uint64_t{first} * block_bytes,
                                          block_bytes, header_bytes, count);
  if (scrubbed.ok()) scrubbed = stream_.Synchronize(timeout).WithContext("header scrub");
  if (scrubbed.code() == StatusCode::kDeadlineExceeded) {
    // The scrub may still run: its memory stays mapped (cuMemUnmap does not wait for the GPU,
    // and a kernel on unmapped memory faults) until the destructor has waited for it.
    return scrubbed;
  }
  if (!scrubbed.ok()) {  // the blocks are not usable: undo the mapping and the bookkeeping
    UndoMapBlocks(*pool, *cover, first, count, mapped, upgraded);
    return scrubbed;
  }
  phases.scrub_ms = MsSince(scrub_start);
  phases.total_ms = MsSince(start);
  return phases;
}

Result<uint32_t> DeviceBorrower::MapForReading(const std::string& name, uint32_t first,
                                               uint32_t count, uint64_t block_bytes,
                                               uint32_t block_count) {
  VmmView* pool = view(name);
  if (pool == nullptr) return NotFound("no region '" + name + "' to read blocks of");
  BATON_RETURN_IF_ERROR(ctx_.MakeCurrent());
  BATON_ASSIGN_OR_RETURN(ChunkCover * cover, CoverOf(name, *pool, block_bytes, block_count));
  BATON_ASSIGN_OR_RETURN(std::vector<ChunkSpan> spans, cover->AddReadOnly(first, count));
  uint32_t chunks = 0;
  for (size_t i = 0; i < spans.size(); ++i) {
    // Never writable, not even for a moment: this memory is not this engine's yet.
    Result<VmmMapStats> m = pool->Map(OffsetOf(*pool, spans[i]), BytesOf(*pool, spans[i]),
                                      {.access = VmmAccess::kRead, .read_write_fallback = false});
    if (!m.ok()) {
      for (size_t j = 0; j < i; ++j) {
        (void)pool->Unmap(OffsetOf(*pool, spans[j]), BytesOf(*pool, spans[j]));
      }
      cover->ForgetReadOnly(spans);
      return FailedPrecondition("the pool's chunks could not be mapped read-only: " +
                                m.status().message());
    }
    chunks += spans[i].count;
  }
  return chunks;
}

Status DeviceBorrower::UnmapRead(const std::string& name) {
  VmmView* pool = view(name);
  auto cover = covers_.find(name);
  if (pool == nullptr || cover == covers_.end()) return OkStatus();
  // Work still reading them must be done: an unmap under a running kernel faults it.
  BATON_RETURN_IF_ERROR(ctx_.MakeCurrent());
  Status first_failure = OkStatus();
  for (const ChunkSpan& s : cover->second.DropReadOnly()) {
    Status unmapped = pool->Unmap(OffsetOf(*pool, s), BytesOf(*pool, s));
    if (!unmapped.ok() && first_failure.ok()) first_failure = unmapped;
  }
  return first_failure;
}

Status DeviceBorrower::UnmapBlocks(const std::string& name, uint32_t first, uint32_t count) {
  VmmView* pool = view(name);
  auto cover = covers_.find(name);
  if (pool == nullptr || cover == covers_.end()) {
    return NotFound("no blocks of region '" + name + "' are mapped");
  }
  BATON_ASSIGN_OR_RETURN(std::vector<ChunkSpan> spans, cover->second.Remove(first, count));
  for (const ChunkSpan& s : spans) {
    Status unmapped = pool->Unmap(uint64_t{s.first} * pool->chunk_bytes(),
                                  uint64_t{s.count} * pool->chunk_bytes());
    if (!unmapped.ok()) {  // still mapped: keep counting the blocks as held
      (void)cover->second.Add(first, count);
      return unmapped;
    }
  }
  return OkStatus();
}

VmmView* DeviceBorrower::view(const std::string& name) {
  auto it = views_.find(name);
  return it == views_.end() ? nullptr : &it->second;
}

}  // namespace baton

#endif  // BATON_HAVE_CUDA_HEADERS
