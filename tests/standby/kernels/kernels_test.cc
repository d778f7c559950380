#include "standby/kernels/kernels.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "standby/kernels/compute_pool.h"
#include "standby/kernels/half.h"
#include "standby/kernels/kernels_gemm.h"

namespace baton {
namespace {

class PathTest : public ::testing::TestWithParam<KernelPath> {
 protected:
  void SetUp() override {
    if (!SetKernelPath(GetParam())) GTEST_SKIP() << "CPU lacks this kernel path";
  }
  void TearDown() override { SetKernelPath(saved_); }
  KernelPath saved_ = ActiveKernelPath();
};

bool SameFloat(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, 4) == 0;
}

TEST_P(PathTest, ConvertsEveryHalfAndBFloat16Exactly) {
  std::vector<uint8_t> bytes(2 * 65536 + 1);
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t v = static_cast<uint16_t>(i);
    std::memcpy(bytes.data() + 1 + 2 * i, &v, 2);  // odd address on purpose
  }
  std::vector<float> f16(65536), bf16(65536);
  ConvertToFloat(DType::kF16, bytes.data() + 1, f16.data(), 65536);
  ConvertToFloat(DType::kBF16, bytes.data() + 1, bf16.data(), 65536);
  for (uint32_t i = 0; i < 65536; ++i) {
    ASSERT_TRUE(SameFloat(f16[i], HalfToFloat(static_cast<uint16_t>(i)))) << i;
    ASSERT_TRUE(SameFloat(bf16[i], BFloat16ToFloat(static_cast<uint16_t>(i)))) << i;
  }
}

// A [rows, cols] matrix of random values in `dtype` at an address `offset` bytes into its
// buffer, and the floats it stands for.
struct TestMatrix {
  TestMatrix(DType dtype, int64_t rows, int64_t cols, size_t offset, uint32_t seed)
      : values(rows * cols), bytes(offset + rows * cols * DTypeSize(dtype)) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    for (float& v : values) v = normal(rng);
    uint8_t* p = bytes.data() + offset;
    for (size_t i = 0; i < values.size(); ++i) {
      if (dtype == DType::kF32) {
        std::memcpy(p + 4 * i, &values[i], 4);
      } else {
        const uint16_t h =
            dtype == DType::kF16 ? FloatToHalf(values[i]) : FloatToBFloat16(values[i]);
        std::memcpy(p + 2 * i, &h, 2);
        values[i] = dtype == DType::kF16 ? HalfToFloat(h) : BFloat16ToFloat(h);
      }
    }
    m = {dtype, rows, cols, p};
  }
  std::vector<float> values;
  std::vector<uint8_t> bytes;
  Matrix m;
};

TEST_P(PathTest, MatMulIsBitwiseIndependentOfBatchAndThreads) {
  ComputePool pool(3);
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    // Past 16 the blocked product takes over; past a few hundred it cuts the inner dimension.
    for (int64_t cols : {1, 7, 8, 16, 29, 64, 100, 1000, 2063}) {
      for (size_t offset : {0, 1, 4}) {
        TestMatrix w(dtype, 37, cols, offset, static_cast<uint32_t>(cols));
        std::vector<float> x(9 * cols);
        std::mt19937 rng(1);
        std::normal_distribution<float> normal;
        for (float& v : x) v = normal(rng);
        std::vector<float> all(9 * 37), one(37);
        MatMul(w.m, x.data(), 9, all.data(), &pool);
        for (int t = 0; t < 9; ++t) {
          MatMul(w.m, x.data() + t * cols, 1, one.data(), nullptr);
          for (int r = 0; r < 37; ++r) {
            ASSERT_EQ(one[r], all[t * 37 + r]) << "cols " << cols << " token " << t;
            ASSERT_EQ(one[r], Dot(w.values.data() + r * cols, x.data() + t * cols, cols));
            double want = 0;
            for (int64_t i = 0; i < cols; ++i) {
              want += static_cast<double>(w.values[r * cols + i]) * x[t * cols + i];
            }
            ASSERT_NEAR(one[r], want, 1e-4 * (1 + std::abs(want)));
          }
        }
      }
    }
  }
}

// The blocked product's 256-bit and 512-bit register blocks give the same bits as the
// one-row dot product (tokens 1 to 11 cover every partial block).
TEST(GemmBlocksTest, BothRegisterBlockingsMatchTheDotProductBitwise) {
  if (!SetKernelPath(KernelPath::kAvx2)) GTEST_SKIP() << "CPU lacks AVX2";
  for (bool avx512 : {false, true}) {
    if (!UseAvx512Blocks(avx512)) continue;
    for (int64_t cols : {16, 40, 700, 2063}) {
      TestMatrix w(DType::kBF16, 13, cols, 0, static_cast<uint32_t>(cols));
      for (int64_t tokens = 3; tokens <= 11; ++tokens) {
        std::vector<float> x(tokens * cols), y(tokens * 13);
        std::mt19937 rng(static_cast<uint32_t>(tokens));
        std::normal_distribution<float> normal;
        for (float& v : x) v = normal(rng);
        MatMul(w.m, x.data(), tokens, y.data(), nullptr);
        for (int64_t t = 0; t < tokens; ++t) {
          for (int r = 0; r < 13; ++r) {
            ASSERT_EQ(y[t * 13 + r], Dot(w.values.data() + r * cols, x.data() + t * cols, cols))
                << "avx512 " << avx512 << " cols " << cols << " tokens " << tokens;
          }
        }
      }
    }
  }
  UseAvx512Blocks(true);  // back to the CPU's own choice where it has AVX-512
}

TEST_P(PathTest, AxpyNormAndSilu) {
  std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, y(10, 1.0f);
  Axpy(0.5f, x.data(), y.data(), 10);
  for (int i = 0; i < 10; ++i) EXPECT_FLOAT_EQ(y[i], 1 + 0.5f * x[i]);
  std::vector<float> w(10, 2.0f), out(10);
  RmsNorm(x.data(), w.data(), 10, 0.0f, out.data());
  const double rms = std::sqrt(385.0 / 10);
  for (int i = 0; i < 10; ++i) EXPECT_NEAR(out[i], 2 * x[i] / rms, 1e-6);
  std::vector<float> g = {-2, 0, 3}, u = {1, 5, 2};
  SiluMul(g.data(), u.data(), 3);
  EXPECT_NEAR(g[0], -2 / (1 + std::exp(2.0)), 1e-6);
  EXPECT_EQ(g[1], 0.0f);
  EXPECT_NEAR(g[2], 3 / (1 + std::exp(-3.0)) * 2, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Paths, PathTest,
                         ::testing::Values(KernelPath::kAvx2, KernelPath::kPortable));

TEST(ComputePoolTest, CoversTheRangeOnceWithDistinctWorkers) {
  for (int threads : {1, 2, 5}) {
    ComputePool pool(threads);
    EXPECT_EQ(pool.threads(), threads);
    for (int64_t n : {0, 1, 3, 100, 1001}) {
      for (int round = 0; round < 20; ++round) {
        std::vector<std::atomic<int>> hits(n);
        std::vector<std::atomic<int>> busy(threads);
        pool.ParallelFor(n, 1, [&](int64_t begin, int64_t end, int worker) {
          ASSERT_GE(worker, 0);
          ASSERT_LT(worker, threads);
          EXPECT_EQ(busy[worker].exchange(1), 0) << "worker " << worker << " used twice at once";
          for (int64_t i = begin; i < end; ++i) hits[i].fetch_add(1);
          busy[worker].store(0);
        });
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1);
      }
    }
  }
}

// Back-to-back jobs (workers still spinning) and jobs after a pause longer than the spin
// (workers asleep): each covers its range exactly once and sees its own job's data.
TEST(ComputePoolTest, BackToBackAndAfterSleepJobsEachRunOnce) {
  ComputePool pool(3);
  std::vector<int64_t> out(64);
  for (int job = 0; job < 5000; ++job) {
    const int64_t n = 1 + job % 64;
    pool.ParallelFor(n, 1, [&](int64_t begin, int64_t end, int) {
      for (int64_t i = begin; i < end; ++i) out[i] += job;
    });
    if (job % 1000 == 999) std::this_thread::sleep_for(ComputePool::kSpin * 3);
  }
  for (int64_t i = 0; i < 64; ++i) {
    int64_t want = 0;
    for (int job = 0; job < 5000; ++job) want += (1 + job % 64 > i) ? job : 0;
    EXPECT_EQ(out[i], want) << "element " << i;
  }
}

// An exception from the caller's chunk reaches the caller after the workers left the job,
// and the pool runs the next job normally.
TEST(ComputePoolTest, ACallersExceptionLeavesThePoolUsable) {
  ComputePool pool(3);
  std::atomic<int> ran{0};
  EXPECT_THROW(pool.ParallelFor(64, 1,
                                [&](int64_t, int64_t, int worker) {
                                  if (worker == 0) throw std::runtime_error("chunk failed");
                                  std::this_thread::sleep_for(std::chrono::milliseconds(1));
                                  ran.fetch_add(1);
                                }),
               std::runtime_error);
  const int after_throw = ran.load();
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(ran.load(), after_throw) << "a worker ran a chunk after ParallelFor returned";
  std::vector<std::atomic<int>> hits(100);
  pool.ParallelFor(100, 1, [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i) hits[i].fetch_add(1);
  });
  for (int i = 0; i < 100; ++i) EXPECT_EQ(hits[i].load(), 1) << i;
}

TEST(ComputePoolTest, SmallRangesStayOnTheCaller) {
  ComputePool pool(4);
  int calls = 0;
  pool.ParallelFor(10, 100, [&](int64_t begin, int64_t end, int worker) {
    ++calls;
    EXPECT_EQ(begin, 0);
    EXPECT_EQ(end, 10);
    EXPECT_EQ(worker, 0);
  });
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace baton
