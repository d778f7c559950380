// What the CUDA driver refuses among the calls Baton makes, asserted through the driver itself:
// on a GPU host these tests check the real driver, and on the fake driver's emulated device
// (cuda_gpu_tests_on_emulated_device) they check that the emulation refuses the same, so that
// a test which passes on the emulated device does not pass only because the emulation is
// lenient. Where the driver documents the error code, the code is asserted; elsewhere only
// the refusal. Skipped without a GPU or the emulated device.
#include <gtest/gtest.h>

#include "tests/cuda/cuda_test_util.h"

#ifdef BATON_HAVE_CUDA_HEADERS

#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <optional>
#include <vector>

#include "cuda/memory/pinned_host.h"
#include "cuda/memory/rematerializer.h"
#include "cuda/memory/vmm.h"

namespace baton {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

// An anonymous host mapping, unmapped on destruction.
class HostMap {
 public:
  explicit HostMap(size_t bytes, int prot = PROT_READ | PROT_WRITE) : bytes_(bytes) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    data_ = p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
    if (data_ != nullptr) {
      for (size_t i = 0; i < bytes; i += 4096) data_[i] = static_cast<uint8_t>(i >> 12);
      if (prot != (PROT_READ | PROT_WRITE)) ::mprotect(data_, bytes, prot);
    }
  }
  ~HostMap() {
    if (data_ != nullptr) ::munmap(data_, bytes_);
  }
  uint8_t* data() const { return data_; }

 private:
  size_t bytes_;
  uint8_t* data_ = nullptr;
};

// `bytes` of device memory in one chunk, mapped read-write: the device side of the copies
// below. Not movable: the view holds the region's chunks.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  Status Map(const PrimaryContext& ctx, uint64_t bytes) {
    BATON_ASSIGN_OR_RETURN(region_, VmmRegion::Create(ctx, {.bytes = bytes, .chunk_bytes = bytes}));
    BATON_ASSIGN_OR_RETURN(view_, VmmView::Reserve(ctx, region_->chunk_bytes(),
                                                   region_->chunk_count(), region_->granularity()));
    BATON_RETURN_IF_ERROR(view_->Borrow(*region_));
    return view_->MapAll({}).status();
  }
  CUdeviceptr base() const { return view_->base(); }

 private:
  std::optional<VmmRegion> region_;
  std::optional<VmmView> view_;  // after region_: destroyed first
};

CUresult Register(const PrimaryContext& ctx, void* p, size_t bytes, unsigned flags) {
  return ctx.driver()->cuMemHostRegister(p, bytes, flags);
}

TEST(VmmDriverRulesTest, HostRegisterRefusesBadArgumentsAndOverlaps) {
  BATON_CUDA_OR_SKIP(ctx);
  HostMap host(8 * kMiB);
  ASSERT_NE(host.data(), nullptr);
  EXPECT_NE(Register(ctx, host.data(), 0, CU_MEMHOSTREGISTER_PORTABLE), CUDA_SUCCESS) << "size 0";
  EXPECT_NE(Register(ctx, host.data(), 4 * kMiB, 0x80), CUDA_SUCCESS) << "an unknown flag";
  ASSERT_EQ(Register(ctx, host.data(), 4 * kMiB, CU_MEMHOSTREGISTER_PORTABLE), CUDA_SUCCESS);
  EXPECT_EQ(Register(ctx, host.data() + 2 * kMiB, 4 * kMiB, CU_MEMHOSTREGISTER_PORTABLE),
            CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  EXPECT_EQ(ctx.driver()->cuMemHostUnregister(host.data() + 4 * kMiB),
            CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED)
      << "never registered";
  EXPECT_EQ(ctx.driver()->cuMemHostUnregister(host.data()), CUDA_SUCCESS);
  EXPECT_EQ(ctx.driver()->cuMemHostUnregister(host.data()), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED)
      << "unregistered twice";
}

// The adopted weight arena of a restarted controller is mapped read-only: the driver needs
// CU_MEMHOSTREGISTER_READ_ONLY for it, where the device supports that flag.
TEST(VmmDriverRulesTest, ReadOnlyHostMemoryNeedsTheReadOnlyFlag) {
  BATON_CUDA_OR_SKIP(ctx);
  HostMap host(4 * kMiB, PROT_READ);
  ASSERT_NE(host.data(), nullptr);
  EXPECT_EQ(Register(ctx, host.data(), 4 * kMiB, CU_MEMHOSTREGISTER_PORTABLE),
            CUDA_ERROR_INVALID_VALUE);
  const unsigned read_only = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_READ_ONLY;
  if (!ReadOnlyRegisterSupported(ctx)) {
    EXPECT_EQ(Register(ctx, host.data(), 4 * kMiB, read_only), CUDA_ERROR_NOT_SUPPORTED);
    return;
  }
  ASSERT_EQ(Register(ctx, host.data(), 4 * kMiB, read_only), CUDA_SUCCESS);
  EXPECT_EQ(ctx.driver()->cuMemHostUnregister(host.data()), CUDA_SUCCESS);
  if (::getenv("BATON_FAKE_CUDA") == nullptr) return;
  ::setenv("BATON_FAKE_CUDA_NO_READ_ONLY_REGISTER", "1", 1);  // a device without the flag
  EXPECT_FALSE(ReadOnlyRegisterSupported(ctx));
  EXPECT_EQ(Register(ctx, host.data(), 4 * kMiB, read_only), CUDA_ERROR_NOT_SUPPORTED);
  ::unsetenv("BATON_FAKE_CUDA_NO_READ_ONLY_REGISTER");
}

// What failed on an H200: one copy whose host side starts in one registration and runs into
// the next.
TEST(VmmDriverRulesTest, ACopyMayNotRunPastItsRegistration) {
  BATON_CUDA_OR_SKIP(ctx);
  HostMap host(8 * kMiB);
  ASSERT_NE(host.data(), nullptr);
  Result<PinnedHostCache> pinned = PinnedHostCache::Register(ctx, host.data(), 8 * kMiB, 4 * kMiB);
  ASSERT_TRUE(pinned.ok()) << pinned.status().ToString();
  DeviceBuffer dev;
  ASSERT_TRUE(dev.Map(ctx, 8 * kMiB).ok());
  EXPECT_EQ(ctx.driver()->cuMemcpyHtoD(dev.base(), host.data(), 8 * kMiB),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(ctx.driver()->cuMemcpyDtoH(host.data() + kMiB, dev.base(), 4 * kMiB),
            CUDA_ERROR_INVALID_VALUE);
  Result<CopyStats> pieces =
      PlainPinnedCopy(ctx, dev.base(), pinned->data(), 8 * kMiB, pinned->copy_unit());
  EXPECT_TRUE(pieces.ok()) << pieces.status().ToString();
  Result<Rematerializer> remat =
      Rematerializer::Create(ctx, {.streams = 2, .chunk_bytes = 3 * kMiB});
  ASSERT_TRUE(remat.ok());
  Result<CopyStats> copied = remat->Copy(dev.base(), pinned->data(), 8 * kMiB, pinned->copy_unit());
  ASSERT_TRUE(copied.ok()) << "3 MiB chunks cut at the registrations' ends: "
                           << copied.status().ToString();
  EXPECT_EQ(copied->copies, 4u);  // [0,3) [3,4) [4,7) [7,8)
}

TEST(VmmDriverRulesTest, APageableCopyMayNotRunIntoARegistration) {
  BATON_CUDA_OR_SKIP(ctx);
  HostMap host(8 * kMiB);
  ASSERT_NE(host.data(), nullptr);
  ASSERT_EQ(Register(ctx, host.data() + 4 * kMiB, 4 * kMiB, CU_MEMHOSTREGISTER_PORTABLE),
            CUDA_SUCCESS);
  DeviceBuffer dev;
  ASSERT_TRUE(dev.Map(ctx, 8 * kMiB).ok());
  EXPECT_EQ(ctx.driver()->cuMemcpyHtoD(dev.base(), host.data(), 4 * kMiB), CUDA_SUCCESS)
      << "pageable";
  EXPECT_NE(ctx.driver()->cuMemcpyHtoD(dev.base(), host.data() + 3 * kMiB, 2 * kMiB), CUDA_SUCCESS)
      << "pageable, then registered";
  EXPECT_EQ(ctx.driver()->cuMemHostUnregister(host.data() + 4 * kMiB), CUDA_SUCCESS);
}

// A host-NUMA cache is one cuMemCreate allocation per chunk: Baton copies from it one chunk at a
// time (copy_unit), and the emulated device refuses a copy that spans two allocations.
TEST(VmmDriverRulesTest, AHostNumaCacheIsCopiedOneAllocationAtATime) {
  BATON_CUDA_OR_SKIP(ctx);
  std::vector<uint8_t> fallback(8 * kMiB);
  Result<PinnedHostCache> cache =
      PinnedHostCache::Create(ctx, {.bytes = 8 * kMiB, .chunk_bytes = 4 * kMiB}, fallback);
  ASSERT_TRUE(cache.ok()) << cache.status().ToString();
  if (cache->kind() != PinnedHostKind::kHostNuma) GTEST_SKIP() << "no host-NUMA: " << cache->note();
  EXPECT_EQ(cache->copy_unit(), 4 * kMiB);
  DeviceBuffer dev;
  ASSERT_TRUE(dev.Map(ctx, 8 * kMiB).ok());
  Result<CopyStats> pieces =
      PlainPinnedCopy(ctx, dev.base(), cache->data(), 8 * kMiB, cache->copy_unit());
  EXPECT_TRUE(pieces.ok()) << pieces.status().ToString();
  if (std::getenv("BATON_FAKE_CUDA") != nullptr) {
    EXPECT_EQ(ctx.driver()->cuMemcpyHtoD(dev.base(), cache->data() + 2 * kMiB, 4 * kMiB),
              CUDA_ERROR_INVALID_VALUE)
        << "one copy across two allocations";
  }
}

TEST(VmmDriverRulesTest, VmmCallsRefuseMisalignedOverlappingAndUnexportable) {
  BATON_CUDA_OR_SKIP(ctx);
  Result<size_t> g = VmmGranularity(ctx, VmmLocation::kDevice, 0);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const CudaDriver& cu = ctx.driver();
  CUmemAllocationProp prop = VmmChunkProp(ctx, VmmLocation::kDevice, 0);
  CUmemGenericAllocationHandle h = 0;
  EXPECT_EQ(cu->cuMemCreate(&h, *g + 4096, &prop, 0), CUDA_ERROR_INVALID_VALUE) << "not granular";
  ASSERT_EQ(cu->cuMemCreate(&h, 2 * *g, &prop, 0), CUDA_SUCCESS);
  CUdeviceptr base = 0;
  ASSERT_EQ(cu->cuMemAddressReserve(&base, 4 * *g, *g, 0, 0), CUDA_SUCCESS);
  EXPECT_NE(cu->cuMemMap(base + 4096, *g, 0, h, 0), CUDA_SUCCESS) << "misaligned address";
  EXPECT_NE(cu->cuMemMap(base, *g + 4096, 0, h, 0), CUDA_SUCCESS) << "misaligned size";
  EXPECT_NE(cu->cuMemMap(base, 4 * *g, 0, h, 0), CUDA_SUCCESS) << "more than the allocation";
  EXPECT_NE(cu->cuMemMap(base + 3 * *g, 2 * *g, 0, h, 0), CUDA_SUCCESS) << "past the reservation";
  CUmemAccessDesc desc = {};
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = ctx.device();
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  EXPECT_NE(cu->cuMemSetAccess(base, *g, &desc, 1), CUDA_SUCCESS) << "nothing mapped";
  ASSERT_EQ(cu->cuMemMap(base, 2 * *g, 0, h, 0), CUDA_SUCCESS);
  EXPECT_NE(cu->cuMemMap(base + *g, 2 * *g, 0, h, 0), CUDA_SUCCESS) << "over a mapping";
  EXPECT_NE(cu->cuMemSetAccess(base, 3 * *g, &desc, 1), CUDA_SUCCESS) << "partly mapped";
  EXPECT_EQ(cu->cuMemSetAccess(base, 2 * *g, &desc, 1), CUDA_SUCCESS);
  EXPECT_NE(cu->cuMemUnmap(base, *g), CUDA_SUCCESS) << "half a mapping";
  EXPECT_EQ(cu->cuMemUnmap(base, 2 * *g), CUDA_SUCCESS);
  EXPECT_NE(cu->cuMemAddressFree(base, 2 * *g), CUDA_SUCCESS) << "not the reserved size";
  EXPECT_EQ(cu->cuMemAddressFree(base, 4 * *g), CUDA_SUCCESS);
  EXPECT_EQ(cu->cuMemRelease(h), CUDA_SUCCESS);

  // Only an allocation made with POSIX_FILE_DESCRIPTOR requested exports an fd.
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
  ASSERT_EQ(cu->cuMemCreate(&h, *g, &prop, 0), CUDA_SUCCESS);
  int fd = -1;
  EXPECT_NE(cu->cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
            CUDA_SUCCESS);
  if (fd >= 0) ::close(fd);
  EXPECT_EQ(cu->cuMemRelease(h), CUDA_SUCCESS);
}

}  // namespace
}  // namespace baton

#endif  // BATON_HAVE_CUDA_HEADERS
