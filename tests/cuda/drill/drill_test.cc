// The GPU promotion drill between real processes (cuda/drill/device_drill.h) at small sizes: a
// pool exported and imported across processes, a primary killed in the middle of a kernel,
// the standby promoted onto memory already there. Skipped without a GPU.
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
  EXPECT_EQ(r->standby["map_calls"], 8);
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

}  // namespace
}  // namespace baton

#endif  // BATON_HAVE_CUDA_HEADERS
