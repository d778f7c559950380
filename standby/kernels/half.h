// Half-precision conversions: IEEE 754 binary16 (F16) and bfloat16 (BF16) to and from float.
//
// Float to half rounds to nearest, ties to even; values beyond the format's range become
// infinity of the same sign, NaN stays NaN (made quiet, sign kept), and numbers below the
// smallest subnormal round to signed zero. Half to float is exact. Pure functions on plain
// values; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>

namespace baton {

uint16_t FloatToHalf(float value);
float HalfToFloat(uint16_t bits);
uint16_t FloatToBFloat16(float value);
float BFloat16ToFloat(uint16_t bits);

// Bulk forms of the above; `in` and `out` must not overlap.
void FloatsToHalf(const float* in, uint16_t* out, size_t count);
void FloatsToBFloat16(const float* in, uint16_t* out, size_t count);
void HalfsToFloat(const uint16_t* in, float* out, size_t count);
void BFloat16sToFloat(const uint16_t* in, float* out, size_t count);

}  // namespace baton
