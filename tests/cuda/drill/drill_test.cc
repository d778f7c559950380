// The GPU promotion drill between real processes (cuda/drill/device_drill.h) at small sizes: a
// pool exported and imported across processes, a primary killed in the middle of a kernel,
// the standby promoted at once onto the pool's reserve chunk, before the reap, and granted
// the dead primary's chunks after it. Skipped without a GPU; make test runs it on the emulated
// device too (cuda_gpu_tests_on_emulated_device).
#include <gtest/gtest.h>

#include "cuda/drill/device_drill.h"
#include "tests/cuda/cuda_test_util.h"

#ifdef BATON_HAVE_CUDA_HEADERS

namespace baton {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

TEST(DrillTest, KillThePrimaryMidKernelAndPromoteTheStandby) {
  BATON_CUDA_OR_SKIP(ctx);
  Result<VmmRegion> weights =
      VmmRegion::Create(ctx, {.name = "weights", .bytes = 256 * kMiB, .chunk_bytes = 64 * kMiB});
  ASSERT_TRUE(weights.ok()) << weights.status().ToString();
  ASSERT_TRUE(FillDrillWeights(ctx, *weights).ok());
  testing::TempDir dir;
  DrillConfig config{.pool_bytes = 256 * kMiB,
                     .pool_chunk_bytes = 32 * kMiB,
                     .block_bytes = 2 * kMiB,
                     .header_bytes = 64,
                     .peer_command = {testing::BinDir() + "/baton_vmm_peer_helper"},
                     .work_dir = dir.path()};
  Result<DrillResult> r = RunPromotionDrill(ctx, *weights, config);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->writes_crossed);
  EXPECT_TRUE(r->stale_writes_stopped);
  EXPECT_TRUE(r->headers_scrubbed);
  EXPECT_GT(r->counter_at_kill, 0u);
  // Promoted on the reserve (the last chunk) before the reap: one chunk mapped, its blocks
  // free of any foreign byte while the primary died and after its blocks were granted; the
  // primary's committed block copied device to device out of a read-only mapping.
  EXPECT_EQ(r->reserve_blocks, 16u);
  EXPECT_EQ(r->standby["map_calls"], 1);
  EXPECT_TRUE(r->no_foreign_byte) << "own_blocks_clean " << r->standby["own_blocks_clean"]
                                  << ", clean_after_grant " << r->standby["clean_after_grant"];
  EXPECT_TRUE(r->kv_copy_ok);
  EXPECT_TRUE(r->reused_after_barrier);
  EXPECT_EQ(r->standby["header_zero"], 1);
  EXPECT_EQ(r->standby["counter_stable"], 1);
  EXPECT_GT(r->promotion_ms, 0);
}

TEST(DrillTest, BadConfigIsRefused) {
  BATON_CUDA_OR_SKIP(ctx);
  Result<VmmRegion> weights = VmmRegion::Create(ctx, {.name = "weights", .bytes = 2 * kMiB});
  ASSERT_TRUE(weights.ok());
  EXPECT_EQ(RunPromotionDrill(ctx, *weights, {}).status().code(), StatusCode::kInvalidArgument);
}

// A peer is started as a launch role, by name; any other first argument is refused (exit 2)
// before it touches a device or the owner's socket.
TEST(DrillTest, APeerOfAnUnknownRoleIsRefused) {
  for (const char* role : {"leader", "", "Primary"}) {
    EXPECT_EQ(RunDrillPeer({role, "/nonexistent.sock", "/nonexistent.report", "0", "64", "4096"}),
              2)
        << role;
  }
}

}  // namespace
}  // namespace baton

#endif  // BATON_HAVE_CUDA_HEADERS
