#include "standby/model/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace baton {
namespace {

std::vector<float> LogProbs(const std::vector<double>& p) {
  std::vector<float> out;
  for (double v : p) out.push_back(static_cast<float>(std::log(v)));
  return out;
}

// Frequencies of each token over `draws` (seed, position) pairs.
std::vector<double> Frequencies(const std::vector<float>& logits, SamplingParams p, int draws) {
  std::vector<double> freq(logits.size());
  for (int i = 0; i < draws; ++i) {
    p.seed = static_cast<uint64_t>(i / 100);
    const int t = SampleToken(logits.data(), static_cast<int>(logits.size()), p, i % 100);
    freq[t] += 1.0 / draws;
  }
  return freq;
}

TEST(SamplerTest, PureFunctionOfSeedPositionLogits) {
  std::vector<float> logits = {0.1f, 0.5f, -0.3f, 0.2f, 0.45f, 0.0f};
  const SamplingParams p{0.8f, 0.9f, 1234};
  for (uint64_t pos = 0; pos < 50; ++pos) {
    const int first = SampleToken(logits.data(), 6, p, pos);
    for (int again = 0; again < 3; ++again) EXPECT_EQ(SampleToken(logits.data(), 6, p, pos), first);
  }
  int differ = 0;
  for (uint64_t pos = 0; pos < 200; ++pos) {
    differ += SampleToken(logits.data(), 6, p, pos) != SampleToken(logits.data(), 6, p, pos + 1);
  }
  EXPECT_GT(differ, 50);  // the draw changes with the position
  EXPECT_EQ(SampleUniform(1, 2), SampleUniform(1, 2));
  EXPECT_NE(SampleUniform(1, 2), SampleUniform(2, 1));
}

TEST(SamplerTest, UniformIsInRangeAndBalanced) {
  double sum = 0;
  for (uint64_t i = 0; i < 100000; ++i) {
    const double u = SampleUniform(i / 1000, i % 1000);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  EXPECT_NEAR(sum / 100000, 0.5, 0.01);
}

TEST(SamplerTest, TemperatureZeroIsArgmaxLowestIdOnTie) {
  std::vector<float> logits = {0.1f, 2.0f, -1.0f, 2.0f};
  for (uint64_t seed = 0; seed < 20; ++seed) {
    EXPECT_EQ(SampleToken(logits.data(), 4, {0.0f, 1.0f, seed}, seed * 3), 1);
  }
  EXPECT_EQ(SampleToken(logits.data(), 4, {-1.0f, 1.0f, 0}, 0), 1);
}

TEST(SamplerTest, TinyTopPIsArgmax) {
  std::vector<float> logits = {0.1f, 0.3f, 0.29f, -2.0f, 0.25f};
  for (uint64_t seed = 0; seed < 200; ++seed) {
    EXPECT_EQ(SampleToken(logits.data(), 5, {1.5f, 1e-6f, seed}, seed), 1);
  }
}

TEST(SamplerTest, DistributionFollowsSoftmax) {
  const std::vector<float> logits = LogProbs({0.5, 0.3, 0.2});
  const std::vector<double> f = Frequencies(logits, {1.0f, 1.0f, 0}, 40000);
  EXPECT_NEAR(f[0], 0.5, 0.015);
  EXPECT_NEAR(f[1], 0.3, 0.015);
  EXPECT_NEAR(f[2], 0.2, 0.015);
}

TEST(SamplerTest, TopPKeepsTheNucleusRenormalized) {
  const std::vector<float> logits = LogProbs({0.2, 0.5, 0.3});
  // 0.5 < 0.6 <= 0.5 + 0.3: tokens 1 and 2 remain, as 0.625 and 0.375.
  const std::vector<double> f = Frequencies(logits, {1.0f, 0.6f, 0}, 40000);
  EXPECT_EQ(f[0], 0.0);
  EXPECT_NEAR(f[1], 0.625, 0.015);
  EXPECT_NEAR(f[2], 0.375, 0.015);
}

TEST(SamplerTest, TemperatureFlattensAndSharpens) {
  const std::vector<float> logits = LogProbs({0.7, 0.2, 0.1});
  EXPECT_NEAR(Frequencies(logits, {100.0f, 1.0f, 0}, 30000)[2], 1.0 / 3, 0.02);
  EXPECT_GT(Frequencies(logits, {0.2f, 1.0f, 0}, 30000)[0], 0.99);
}

TEST(SamplerTest, NonFiniteLogitsAreNeverChosen) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> logits = {nan, 0.0f, nan, 0.1f, -inf};
  for (uint64_t seed = 0; seed < 200; ++seed) {
    const int t = SampleToken(logits.data(), 5, {1.0f, 1.0f, seed}, 0);
    EXPECT_TRUE(t == 1 || t == 3) << t;
  }
  EXPECT_EQ(SampleToken(logits.data(), 5, {0.0f, 1.0f, 0}, 0), 3);
  std::vector<float> with_inf = {0.0f, inf, 1.0f};
  EXPECT_EQ(SampleToken(with_inf.data(), 3, {1.0f, 0.9f, 5}, 0), 1);
  std::vector<float> all_nan = {nan, nan};
  EXPECT_EQ(SampleToken(all_nan.data(), 2, {1.0f, 1.0f, 5}, 0), 0);
}

TEST(SamplerTest, ValidatesParams) {
  EXPECT_TRUE(ValidateSamplingParams({0.0f, 1.0f, 0}).ok());
  EXPECT_TRUE(ValidateSamplingParams({1.2f, 0.01f, 9}).ok());
  EXPECT_FALSE(ValidateSamplingParams({-0.1f, 1.0f, 0}).ok());
  EXPECT_FALSE(ValidateSamplingParams({std::nanf(""), 1.0f, 0}).ok());
  EXPECT_FALSE(ValidateSamplingParams({1.0f, 0.0f, 0}).ok());
  EXPECT_FALSE(ValidateSamplingParams({1.0f, 1.5f, 0}).ok());
}

}  // namespace
}  // namespace baton
