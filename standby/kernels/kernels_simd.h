// Internal to the compute core (standby/kernels/kernels.cc, kernels_gemm.cc): the AVX2 target
// attribute and the horizontal sum every AVX2 dot product ends with, shared so that every kernel
// reduces in the same order (the bitwise-identical results of standby/kernels/kernels.h depend on
// it).
#pragma once

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define BATON_HAVE_AVX2_PATH 1
#define BATON_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define BATON_UNROLL _Pragma("GCC unroll 4")

namespace baton {

// ((lo + hi) pairwise, then the two halves of that, then the last pair): lane order fixed.
BATON_TARGET_AVX2 inline __attribute__((always_inline)) float HorizontalSum(__m256 v) {
  const __m128 lo = _mm256_castps256_ps128(v);
  const __m128 hi = _mm256_extractf128_ps(v, 1);
  __m128 s = _mm_add_ps(lo, hi);
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

}  // namespace baton

#else
#define BATON_HAVE_AVX2_PATH 0
#endif
