#include "standby/kernels/half.h"

#include <bit>

namespace baton {
namespace {

constexpr uint32_t kSignMask = 0x80000000u;
constexpr uint32_t kFloatInf = 0x7f800000u;
// 2^16: every float at or above it (and every float in [65520, 2^16), by rounding) is
// infinity in half precision.
constexpr uint32_t kHalfOverflow = (127u + 16u) << 23;
// 2^-14, the smallest normal half.
constexpr uint32_t kHalfMinNormal = 113u << 23;
// 0.5: adding it to a float below 2^-14 leaves the half subnormal's bits, rounded to
// nearest even by the FPU, in the low mantissa bits.
constexpr uint32_t kDenormMagic = ((127u - 15u) + (23u - 10u) + 1u) << 23;

}  // namespace

uint16_t FloatToHalf(float value) {
  uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint32_t sign = bits & kSignMask;
  bits ^= sign;
  uint32_t out;
  if (bits >= kHalfOverflow) {
    // Infinity stays infinity; a NaN keeps its top payload bits and is made quiet.
    out = bits > kFloatInf ? 0x7e00u | ((bits >> 13) & 0x3ffu) : 0x7c00u;
  } else if (bits < kHalfMinNormal) {
    const float shifted = std::bit_cast<float>(bits) + std::bit_cast<float>(kDenormMagic);
    out = std::bit_cast<uint32_t>(shifted) - kDenormMagic;
  } else {
    const uint32_t mantissa_odd = (bits >> 13) & 1u;
    bits += ((15u - 127u) << 23) + 0xfffu + mantissa_odd;
    out = bits >> 13;
  }
  return static_cast<uint16_t>(out | (sign >> 16));
}

float HalfToFloat(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000u) << 16;
  const uint32_t exponent = (half >> 10) & 0x1fu;
  const uint32_t mantissa = half & 0x3ffu;
  if (exponent == 0x1f) {
    return std::bit_cast<float>(sign | kFloatInf | (mantissa << 13));
  }
  if (exponent == 0) {
    // Zero or subnormal: mantissa x 2^-24, exact in float.
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(magnitude));
  }
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

uint16_t FloatToBFloat16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & ~kSignMask) > kFloatInf) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // quiet NaN, sign kept
  }
  const uint32_t lsb = (bits >> 16) & 1u;
  return static_cast<uint16_t>((bits + 0x7fffu + lsb) >> 16);
}

float BFloat16ToFloat(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

void FloatsToHalf(const float* in, uint16_t* out, size_t count) {
  for (size_t i = 0; i < count; ++i) out[i] = FloatToHalf(in[i]);
}

void FloatsToBFloat16(const float* in, uint16_t* out, size_t count) {
  for (size_t i = 0; i < count; ++i) out[i] = FloatToBFloat16(in[i]);
}

void HalfsToFloat(const uint16_t* in, float* out, size_t count) {
  for (size_t i = 0; i < count; ++i) out[i] = HalfToFloat(in[i]);
}

void BFloat16sToFloat(const uint16_t* in, float* out, size_t count) {
  for (size_t i = 0; i < count; ++i) out[i] = BFloat16ToFloat(in[i]);
}

}  // namespace baton
