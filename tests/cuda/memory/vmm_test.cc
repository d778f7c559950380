// VMM regions in one process on a real GPU: create, export, import, map read-write and
// read-only, the kernels, the pinned host cache and rematerialization. Skipped without a GPU.
#include "cuda/memory/vmm.h"

#include <gtest/gtest.h>

#include "tests/cuda/cuda_test_util.h"

#ifdef BATON_HAVE_CUDA_HEADERS

#include <sys/mman.h>

#include "cuda/kernels/kernels.h"
#include "cuda/kernels/kernels_ptx.h"
#include "cuda/memory/pinned_host.h"
#include "cuda/memory/rematerializer.h"

namespace baton {
namespace {

using namespace std::chrono_literals;

constexpr uint64_t kMiB = 1ull << 20;

Result<uint32_t> ReadWord(const PrimaryContext& ctx, CUdeviceptr at) {
  uint32_t w = 0;
  BATON_RETURN_IF_ERROR(BATON_CU(ctx.driver(), cuMemcpyDtoH, &w, at, sizeof(w)));
  return w;
}

TEST(VmmTest, ExportedChunksImportAndShowTheSameMemory) {
  BATON_CUDA_OR_SKIP(ctx);
  Result<VmmRegion> region =
      VmmRegion::Create(ctx, {.name = "pool", .bytes = 5 * kMiB, .chunk_bytes = 2 * kMiB});
  ASSERT_TRUE(region.ok()) << region.status().ToString();
  EXPECT_EQ(region->chunk_count(), 3u);  // rounded up to whole chunks
  ASSERT_EQ(region->chunk_bytes() % region->granularity(), 0u);

  Result<VmmView> owner =
      VmmView::Reserve(ctx, region->chunk_bytes(), region->chunk_count(), region->granularity());
  ASSERT_TRUE(owner.ok()) << owner.status().ToString();
  ASSERT_TRUE(owner->Borrow(*region).ok());
  Result<VmmMapStats> mapped = owner->MapAll({.access = VmmAccess::kReadWrite});
  ASSERT_TRUE(mapped.ok()) << mapped.status().ToString();
  EXPECT_EQ(mapped->map_calls, 3u);

  Result<Kernels> kernels = Kernels::Load(ctx);
  ASSERT_TRUE(kernels.ok()) << kernels.status().ToString();
  Result<Stream> stream = Stream::Create(ctx.driver());
  ASSERT_TRUE(stream.ok());
  ASSERT_TRUE(kernels->Fill(*stream, owner->base(), owner->bytes() / 4, 42).ok());
  ASSERT_TRUE(stream->Synchronize(10s).ok());

  Result<std::vector<UniqueFd>> fds = region->ExportAll();
  ASSERT_TRUE(fds.ok()) << fds.status().ToString();
  Result<VmmView> borrower =
      VmmView::Reserve(ctx, region->chunk_bytes(), region->chunk_count(), region->granularity());
  ASSERT_TRUE(borrower.ok());
  ASSERT_TRUE(borrower->Import(std::move(fds).value()).ok());
  ASSERT_TRUE(borrower->MapAll({.access = VmmAccess::kRead}).ok());
  for (uint64_t off : {uint64_t{0}, 2 * kMiB + 12, 6 * kMiB - 4}) {
    Result<uint32_t> w = ReadWord(ctx, borrower->base() + off);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    EXPECT_EQ(*w, FillPatternWord(off / 4, 42)) << off;
  }
}

// What baton-keeper relies on across a controller restart: the creator's handles and
// mappings all released, only exported fds held, the allocations live on; a region imported
// from them shows the same memory and hands out dups of its fds (mapped again here).
TEST(VmmTest, AnImportedRegionOutlivesItsCreatorAndHandsOutItsFds) {
  BATON_CUDA_OR_SKIP(ctx);
  std::vector<UniqueFd> kept;
  uint64_t chunk_bytes = 0;
  {
    Result<VmmRegion> region =
        VmmRegion::Create(ctx, {.name = "pool", .bytes = 4 * kMiB, .chunk_bytes = 2 * kMiB});
    ASSERT_TRUE(region.ok()) << region.status().ToString();
    chunk_bytes = region->chunk_bytes();
    Result<VmmView> view =
        VmmView::Reserve(ctx, chunk_bytes, region->chunk_count(), region->granularity());
    ASSERT_TRUE(view.ok());
    ASSERT_TRUE(view->Borrow(*region).ok());
    ASSERT_TRUE(view->MapAll({.access = VmmAccess::kReadWrite}).ok());
    const uint32_t word = 0xC0FFEE;
    ASSERT_TRUE(
        BATON_CU(ctx.driver(), cuMemcpyHtoD, view->base() + chunk_bytes + 8, &word, 4).ok());
    Result<std::vector<UniqueFd>> fds = region->ExportAll();
    ASSERT_TRUE(fds.ok()) << fds.status().ToString();
    kept = std::move(fds).value();
  }  // the creator's mapping, reservation and handles are gone
  EXPECT_FALSE(VmmRegion::Import(ctx, "pool", chunk_bytes + 1, {}).ok()) << "no chunks";
  Result<VmmRegion> imported = VmmRegion::Import(ctx, "pool", chunk_bytes, std::move(kept));
  ASSERT_TRUE(imported.ok()) << imported.status().ToString();
  ASSERT_EQ(imported->chunk_count(), 2u);
  Result<std::vector<UniqueFd>> again = imported->ExportAll();
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  Result<VmmView> view =
      VmmView::Reserve(ctx, chunk_bytes, imported->chunk_count(), imported->granularity());
  ASSERT_TRUE(view.ok());
  ASSERT_TRUE(view->Import(std::move(again).value()).ok());
  ASSERT_TRUE(view->MapAll({.access = VmmAccess::kRead}).ok());
  Result<uint32_t> w = ReadWord(ctx, view->base() + chunk_bytes + 8);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(*w, 0xC0FFEEu) << "the allocation outlived its creator's handles";
}

// A driver that refuses read-only access (the fake driver told to) gets a read-write mapping,
// and the stats say so.
TEST(VmmTest, ARefusedReadOnlyMappingIsMappedReadWrite) {
  BATON_CUDA_OR_SKIP(ctx);
  if (::getenv("BATON_FAKE_CUDA") == nullptr) GTEST_SKIP() << "needs the fake driver's refusal";
  Result<VmmRegion> region = VmmRegion::Create(ctx, {.bytes = 8 * kMiB, .chunk_bytes = 4 * kMiB});
  ASSERT_TRUE(region.ok()) << region.status().ToString();
  Result<VmmView> view =
      VmmView::Reserve(ctx, region->chunk_bytes(), region->chunk_count(), region->granularity());
  ASSERT_TRUE(view.ok());
  ASSERT_TRUE(view->Borrow(*region).ok());
  ::setenv("BATON_FAKE_CUDA_NO_READ_ONLY", "1", 1);
  Result<VmmMapStats> refused = view->MapAll({.access = VmmAccess::kRead});
  ::unsetenv("BATON_FAKE_CUDA_NO_READ_ONLY");
  ASSERT_TRUE(refused.ok()) << refused.status().ToString();
  EXPECT_TRUE(refused->read_only_refused);
  view->UnmapAll();
  Result<VmmMapStats> granted = view->MapAll({.access = VmmAccess::kRead});
  ASSERT_TRUE(granted.ok()) << granted.status().ToString();
  EXPECT_FALSE(granted->read_only_refused);
}

TEST(VmmTest, MappingBookkeeping) {
  BATON_CUDA_OR_SKIP(ctx);
  Result<VmmRegion> region = VmmRegion::Create(ctx, {.bytes = 12 * kMiB, .chunk_bytes = 4 * kMiB});
  ASSERT_TRUE(region.ok()) << region.status().ToString();
  const uint64_t chunk = region->chunk_bytes();
  const uint64_t g = region->granularity();
  Result<VmmView> view = VmmView::Reserve(ctx, chunk, region->chunk_count(), g);
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(view->Map(0, chunk, {}).status().code(), StatusCode::kFailedPrecondition);  // no chunks
  ASSERT_TRUE(view->Borrow(*region).ok());
  EXPECT_EQ(view->Map(1, chunk, {}).status().code(), StatusCode::kInvalidArgument);
  if (g < chunk) {
    EXPECT_EQ(view->Map(g, chunk, {}).status().code(), StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(view->Map(0, view->bytes() + chunk, {}).status().code(), StatusCode::kInvalidArgument);
  Result<VmmMapStats> two = view->Map(chunk, 2 * chunk, {});
  ASSERT_TRUE(two.ok()) << two.status().ToString();
  EXPECT_EQ(two->map_calls, 2u);
  EXPECT_EQ(view->Map(0, 2 * chunk, {}).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(view->Unmap(0, chunk).code(), StatusCode::kFailedPrecondition);  // nothing there
  EXPECT_TRUE(view->Unmap(2 * chunk, chunk).ok());
  EXPECT_EQ(view->mapped_bytes(), chunk);
  EXPECT_TRUE(view->Map(0, chunk, {}).ok());
  EXPECT_EQ(view->mapped_bytes(), 2 * chunk);
}

TEST(VmmTest, ScrubZeroesHeadersOnlyAndSpinCounts) {
  BATON_CUDA_OR_SKIP(ctx);
  Result<VmmRegion> region = VmmRegion::Create(ctx, {.bytes = 8 * kMiB, .chunk_bytes = 8 * kMiB});
  ASSERT_TRUE(region.ok());
  Result<VmmView> view = VmmView::Reserve(ctx, region->chunk_bytes(), 1, region->granularity());
  ASSERT_TRUE(view.ok());
  ASSERT_TRUE(view->Borrow(*region).ok());
  ASSERT_TRUE(view->MapAll({}).ok());
  Result<Kernels> k = Kernels::Load(ctx);
  ASSERT_TRUE(k.ok()) << k.status().ToString();
  Result<Stream> s = Stream::Create(ctx.driver());
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(k->Fill(*s, view->base(), view->bytes() / 4, 9).ok());
  const uint64_t block = 1 * kMiB;
  ASSERT_TRUE(k->ScrubHeaders(*s, view->base(), block, 64, 8).ok());
  ASSERT_TRUE(s->Synchronize(10s).ok());
  for (uint64_t b = 0; b < 8; ++b) {
    EXPECT_EQ(*ReadWord(ctx, view->base() + b * block), 0u) << b;
    EXPECT_EQ(*ReadWord(ctx, view->base() + b * block + 60), 0u) << b;
    EXPECT_EQ(*ReadWord(ctx, view->base() + b * block + 64),
              FillPatternWord((b * block + 64) / 4, 9));
  }
  EXPECT_EQ(k->ScrubHeaders(*s, view->base(), block, 6, 8).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(k->Spin(*s, view->base() + 4096, view->base(), 16, 1000).ok());
  ASSERT_TRUE(s->Synchronize(10s).ok());
  uint64_t counter = 0;
  ASSERT_TRUE(BATON_CU(ctx.driver(), cuMemcpyDtoH, &counter, view->base() + 4096, 8).ok());
  EXPECT_EQ(counter, 1000u);
  EXPECT_EQ(*ReadWord(ctx, view->base()), kSpinHeaderWord);
}

TEST(VmmTest, PinnedCacheRematerializesAtFullSpeed) {
  BATON_CUDA_OR_SKIP(ctx);
  const uint64_t bytes = 256 * kMiB;
  // The fallback path: an existing host range registered in chunks.
  void* host = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(host, MAP_FAILED);
  auto* words = static_cast<uint32_t*>(host);
  for (uint64_t i = 0; i < bytes / 4; ++i) words[i] = FillPatternWord(i, 77);
  {
    Result<PinnedHostCache> registered =
        PinnedHostCache::Register(ctx, static_cast<uint8_t*>(host), bytes, 64 * kMiB);
    ASSERT_TRUE(registered.ok()) << registered.status().ToString();
    EXPECT_EQ(registered->kind(), PinnedHostKind::kRegistered);

    Result<VmmRegion> dev = VmmRegion::Create(ctx, {.bytes = bytes, .chunk_bytes = 64 * kMiB});
    ASSERT_TRUE(dev.ok());
    Result<VmmView> view =
        VmmView::Reserve(ctx, dev->chunk_bytes(), dev->chunk_count(), dev->granularity());
    ASSERT_TRUE(view.ok());
    ASSERT_TRUE(view->Borrow(*dev).ok());
    ASSERT_TRUE(view->MapAll({}).ok());
    Result<Rematerializer> remat =
        Rematerializer::Create(ctx, {.streams = 4, .chunk_bytes = 16 * kMiB});
    ASSERT_TRUE(remat.ok());
    Result<CopyStats> copied = remat->Copy(view->base(), registered->data(), bytes);
    ASSERT_TRUE(copied.ok()) << copied.status().ToString();
    EXPECT_EQ(copied->copies, 16u);
    EXPECT_GT(copied->gbps, 0);
    for (uint64_t i : {uint64_t{0}, bytes / 8 + 3, bytes / 4 - 1}) {
      EXPECT_EQ(*ReadWord(ctx, view->base() + i * 4), FillPatternWord(i, 77)) << i;
    }
    // One copy per registration: the driver refuses a copy whose host side starts in one
    // registration and runs past its end.
    Result<CopyStats> plain =
        PlainPinnedCopy(ctx, view->base(), registered->data(), bytes, registered->copy_unit());
    ASSERT_TRUE(plain.ok()) << plain.status().ToString();
    EXPECT_EQ(plain->copies, 4u);
  }
  ::munmap(host, bytes);

  // The preferred path where the driver has it.
  Result<PinnedHostCache> numa =
      PinnedHostCache::CreateHostNuma(ctx, {.bytes = 64 * kMiB, .chunk_bytes = 32 * kMiB});
  if (!numa.ok()) {
    EXPECT_FALSE(QueryHostNuma(ctx).supported) << numa.status().ToString();
    return;
  }
  EXPECT_EQ(numa->kind(), PinnedHostKind::kHostNuma);
  numa->data()[0] = 0xAB;  // the CPU can write it
  numa->data()[numa->bytes() - 1] = 0xCD;
  EXPECT_EQ(numa->data()[0], 0xAB);
}

}  // namespace
}  // namespace baton

#endif  // BATON_HAVE_CUDA_HEADERS
