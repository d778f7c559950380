#include "standby/kernels/half.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace baton {
namespace {

float Bits(uint32_t bits) { return std::bit_cast<float>(bits); }
uint32_t BitsOf(float value) { return std::bit_cast<uint32_t>(value); }

// Round-to-nearest-even by search over every finite non-negative half, in double precision.
uint16_t ReferenceHalf(float value) {
  static const std::vector<double> kHalves = [] {
    std::vector<double> v;
    for (uint32_t h = 0; h < 0x7c00; ++h) v.push_back(HalfToFloat(static_cast<uint16_t>(h)));
    return v;
  }();
  const uint16_t sign = std::signbit(value) ? 0x8000 : 0;
  const double x = std::fabs(static_cast<double>(value));
  if (x >= 65520.0) return sign | 0x7c00;
  const auto it = std::lower_bound(kHalves.begin(), kHalves.end(), x);
  const size_t hi = static_cast<size_t>(it - kHalves.begin());
  if (hi == 0) return sign;
  if (hi == kHalves.size()) return sign | 0x7bff;
  const size_t lo = hi - 1;
  const double dlo = x - kHalves[lo];
  const double dhi = kHalves[hi] - x;
  size_t pick = dlo < dhi ? lo : (dhi < dlo ? hi : (lo % 2 == 0 ? lo : hi));
  return static_cast<uint16_t>(sign | pick);
}

uint16_t ReferenceBFloat16(float value) {
  const uint32_t bits = BitsOf(value);
  const uint32_t lo = bits >> 16;
  if ((bits & 0xffff) == 0) return static_cast<uint16_t>(lo);
  const double x = std::fabs(static_cast<double>(value));
  const double below = std::fabs(static_cast<double>(Bits(lo << 16)));
  // The next bf16 magnitude; past the largest finite one it is infinity, which wins as
  // IEEE's overflow rule says (at or beyond max + half an ulp).
  const double above = ((lo + 1) & 0x7fff) == 0x7f80
                           ? std::ldexp(1.0, 128)
                           : std::fabs(static_cast<double>(Bits((lo + 1) << 16)));
  const double dlo = x - below, dhi = above - x;
  const uint32_t pick = dlo < dhi ? lo : (dhi < dlo ? lo + 1 : (lo % 2 == 0 ? lo : lo + 1));
  return static_cast<uint16_t>(pick);
}

TEST(HalfTest, KnownValues) {
  EXPECT_EQ(FloatToHalf(0.0f), 0x0000);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalf(0.5f), 0x3800);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(0x1p-14f), 0x0400);  // smallest normal
  EXPECT_EQ(FloatToHalf(0x1p-24f), 0x0001);  // smallest subnormal
  EXPECT_EQ(FloatToHalf(0.333333343f), 0x3555);
  EXPECT_FLOAT_EQ(HalfToFloat(0x3c00), 1.0f);
  EXPECT_FLOAT_EQ(HalfToFloat(0xc000), -2.0f);
  EXPECT_FLOAT_EQ(HalfToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(HalfToFloat(0x0001), 0x1p-24f);
  EXPECT_EQ(HalfToFloat(0x03ff), 1023 * 0x1p-24f);
  EXPECT_EQ(BitsOf(HalfToFloat(0x8000)), 0x80000000u);
}

TEST(HalfTest, RoundsToNearestEven) {
  EXPECT_EQ(FloatToHalf(1.0f + 0x1p-11f), 0x3c00);             // tie, down to even
  EXPECT_EQ(FloatToHalf(1.0f + 3 * 0x1p-11f), 0x3c02);         // tie, up to even
  EXPECT_EQ(FloatToHalf(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);  // above the tie
  EXPECT_EQ(FloatToHalf(1.0f + 0x1p-11f - 0x1p-20f), 0x3c00);  // below the tie
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);  // max + half an ulp overflows
  EXPECT_EQ(FloatToHalf(-65520.0f), 0xfc00);
  EXPECT_EQ(FloatToHalf(0x1p-25f), 0x0000);  // subnormal tie, down to even (zero)
  EXPECT_EQ(FloatToHalf(3 * 0x1p-25f), 0x0002);
  EXPECT_EQ(FloatToHalf(0x1p-25f * 1.0001f), 0x0001);
  EXPECT_EQ(FloatToHalf(0x1p-26f), 0x0000);
  EXPECT_EQ(FloatToHalf(-0x1p-26f), 0x8000);
  EXPECT_EQ(FloatToHalf(1023.5f * 0x1p-24f), 0x0400);  // subnormal rounds up to normal
}

TEST(HalfTest, InfinityAndNan) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FloatToHalf(inf), 0x7c00);
  EXPECT_EQ(FloatToHalf(-inf), 0xfc00);
  EXPECT_EQ(FloatToHalf(1e10f), 0x7c00);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::max()), 0x7c00);
  EXPECT_TRUE(std::isinf(HalfToFloat(0x7c00)));
  EXPECT_TRUE(std::isinf(HalfToFloat(0xfc00)) && HalfToFloat(0xfc00) < 0);
  const uint16_t qnan = FloatToHalf(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(qnan & 0x7c00, 0x7c00);
  EXPECT_NE(qnan & 0x03ff, 0);
  EXPECT_EQ(qnan & 0x0200, 0x0200);                      // quiet
  const uint16_t snan = FloatToHalf(Bits(0x7f800001u));  // payload only in low bits
  EXPECT_EQ(snan & 0x7e00, 0x7e00);
  EXPECT_EQ(FloatToHalf(Bits(0xffc00000u)) & 0x8000, 0x8000);  // sign kept
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7c01)));
  EXPECT_TRUE(std::isnan(HalfToFloat(0xfe00)));
}

TEST(HalfTest, EveryHalfRoundTrips) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    const uint16_t back = FloatToHalf(f);
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0) {
      EXPECT_EQ(back, h | 0x200) << std::hex << h;  // NaN comes back quiet
    } else {
      EXPECT_EQ(back, h) << std::hex << h;
    }
  }
}

TEST(HalfTest, MatchesReferenceRounding) {
  // Every exponent, many mantissas, both signs; plus the ties around every half.
  for (uint64_t bits = 0; bits < 0x7f800000u; bits += 997) {
    const float f = Bits(static_cast<uint32_t>(bits));
    ASSERT_EQ(FloatToHalf(f), ReferenceHalf(f)) << std::hex << bits;
    ASSERT_EQ(FloatToHalf(-f), ReferenceHalf(-f)) << std::hex << bits;
  }
  for (uint32_t h = 0; h < 0x7bff; ++h) {
    const float a = HalfToFloat(static_cast<uint16_t>(h));
    const float b = HalfToFloat(static_cast<uint16_t>(h + 1));
    const float mid = (a + b) / 2;  // exact in float
    for (float f : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)}) {
      ASSERT_EQ(FloatToHalf(f), ReferenceHalf(f)) << std::hex << h;
    }
  }
}

TEST(BFloat16Test, KnownValuesAndRounding) {
  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBFloat16(-2.0f), 0xc000);
  EXPECT_EQ(FloatToBFloat16(0.0f), 0x0000);
  EXPECT_EQ(FloatToBFloat16(-0.0f), 0x8000);
  EXPECT_EQ(FloatToBFloat16(Bits(0x3f808000u)), 0x3f80);  // tie, down to even
  EXPECT_EQ(FloatToBFloat16(Bits(0x3f818000u)), 0x3f82);  // tie, up to even
  EXPECT_EQ(FloatToBFloat16(Bits(0x3f808001u)), 0x3f81);
  EXPECT_EQ(FloatToBFloat16(Bits(0x3f807fffu)), 0x3f80);
  EXPECT_EQ(FloatToBFloat16(Bits(0x00000001u)), 0x0000);  // float subnormal
  EXPECT_EQ(FloatToBFloat16(Bits(0x00018000u)), 0x0002);
  EXPECT_FLOAT_EQ(BFloat16ToFloat(0x3f80), 1.0f);
  EXPECT_FLOAT_EQ(BFloat16ToFloat(0x4049), 3.140625f);
}

TEST(BFloat16Test, InfinityAndNan) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FloatToBFloat16(inf), 0x7f80);
  EXPECT_EQ(FloatToBFloat16(-inf), 0xff80);
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::max()), 0x7f80);  // rounds over
  EXPECT_EQ(FloatToBFloat16(Bits(0x7f7f7fffu)), 0x7f7f);
  const uint16_t nan = FloatToBFloat16(Bits(0x7f800001u));  // would round to inf if added
  EXPECT_EQ(nan & 0x7f80, 0x7f80);
  EXPECT_NE(nan & 0x007f, 0);
  EXPECT_EQ(FloatToBFloat16(Bits(0xffffffffu)) & 0x8000, 0x8000);
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(0x7fc0)));
  EXPECT_TRUE(std::isinf(BFloat16ToFloat(0xff80)));
}

TEST(BFloat16Test, MatchesReferenceAndRoundTrips) {
  for (uint64_t bits = 0; bits < 0x7f800000u; bits += 1009) {
    const float f = Bits(static_cast<uint32_t>(bits));
    ASSERT_EQ(FloatToBFloat16(f), ReferenceBFloat16(f)) << std::hex << bits;
    ASSERT_EQ(FloatToBFloat16(-f), ReferenceBFloat16(-f)) << std::hex << bits;
  }
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    const float f = BFloat16ToFloat(static_cast<uint16_t>(b));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(f))));
    } else {
      EXPECT_EQ(FloatToBFloat16(f), b) << std::hex << b;
    }
  }
}

TEST(HalfTest, BulkFormsMatchScalar) {
  std::vector<float> in;
  for (int i = -500; i < 500; ++i) in.push_back(static_cast<float>(i) * 0.37f);
  in.push_back(std::numeric_limits<float>::infinity());
  std::vector<uint16_t> h(in.size()), b(in.size());
  std::vector<float> hf(in.size()), bf(in.size());
  FloatsToHalf(in.data(), h.data(), in.size());
  FloatsToBFloat16(in.data(), b.data(), in.size());
  HalfsToFloat(h.data(), hf.data(), h.size());
  BFloat16sToFloat(b.data(), bf.data(), b.size());
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(h[i], FloatToHalf(in[i]));
    EXPECT_EQ(b[i], FloatToBFloat16(in[i]));
    EXPECT_EQ(hf[i], HalfToFloat(h[i]));
    EXPECT_EQ(bf[i], BFloat16ToFloat(b[i]));
  }
}

}  // namespace
}  // namespace baton
