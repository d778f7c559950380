#include "standby/kernels/kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "standby/kernels/compute_pool.h"
#include "standby/kernels/half.h"
#include "standby/kernels/kernels_choice.h"
#include "standby/kernels/kernels_gemm.h"
#include "standby/kernels/kernels_simd.h"

#if BATON_HAVE_AVX2_PATH
#include <cpuid.h>
#endif

namespace baton {
namespace {

// Input rows handled by one call of a row kernel.
constexpr int kMaxRowTokens = 4;
// From this many input rows on, fp32 weight rows go through the blocked product.
constexpr int64_t kGemmMinTokens = 3;

float ElementAt(DType dtype, const uint8_t* p, int64_t i) {
  if (dtype == DType::kF32) {
    float f;
    std::memcpy(&f, p + 4 * i, 4);
    return f;
  }
  uint16_t bits;
  std::memcpy(&bits, p + 2 * i, 2);
  return dtype == DType::kF16 ? HalfToFloat(bits) : BFloat16ToFloat(bits);
}

// ---- portable path ----------------------------------------------------------------------

float DotPortable(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  }
  for (int j = 0; i < n; ++i, ++j) acc[j] += a[i] * b[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

void AxpyPortable(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

void ConvertPortable(DType dtype, const uint8_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = ElementAt(dtype, src, i);
}

// Per-thread space for rows converted to fp32: slot 0 for MatMul's tiles, slot 1 for the
// portable row kernel.
float* ThreadScratch(int slot, size_t floats) {
  thread_local std::vector<float> scratch[2];
  if (scratch[slot].size() < floats) scratch[slot].resize(floats);
  return scratch[slot].data();
}

void DotRowPortable(DType dtype, const uint8_t* w, const float* const* x, int tokens, int64_t n,
                    float* out) {
  const float* row = reinterpret_cast<const float*>(w);
  if (dtype != DType::kF32 || reinterpret_cast<uintptr_t>(w) % alignof(float) != 0) {
    float* converted = ThreadScratch(1, static_cast<size_t>(n));
    ConvertPortable(dtype, w, converted, n);
    row = converted;
  }
  for (int t = 0; t < tokens; ++t) out[t] = DotPortable(row, x[t], n);
}

// ---- AVX2 + FMA + F16C path -------------------------------------------------------------

#if BATON_HAVE_AVX2_PATH

struct LoadF32 {
  const uint8_t* p;
  BATON_TARGET_AVX2 __m256 operator()(int64_t i) const {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p + 4 * i));
  }
};
struct LoadBf16 {
  const uint8_t* p;
  BATON_TARGET_AVX2 __m256 operator()(int64_t i) const {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
};
struct LoadF16 {
  const uint8_t* p;
  BATON_TARGET_AVX2 __m256 operator()(int64_t i) const {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * i)));
  }
};

// out[t] = dot(w, x[t]) for t < T. Every output uses the same accumulation order (two
// 8-lane accumulators over 16-element steps, one 8-element step, then a scalar tail), so
// the result does not depend on T or on the weight's dtype once converted.
template <int T, typename Load>
BATON_TARGET_AVX2 void DotRowAvx2(const Load& w, DType dtype, const float* const* x, int64_t n,
                                  float* out) {
  __m256 acc0[T], acc1[T];
  BATON_UNROLL
  for (int t = 0; t < T; ++t) acc0[t] = acc1[t] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 w0 = w(i), w1 = w(i + 8);
    BATON_UNROLL
    for (int t = 0; t < T; ++t) {
      acc0[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[t] + i), acc0[t]);
      acc1[t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x[t] + i + 8), acc1[t]);
    }
  }
  if (i + 8 <= n) {
    const __m256 w0 = w(i);
    BATON_UNROLL
    for (int t = 0; t < T; ++t) acc0[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[t] + i), acc0[t]);
    i += 8;
  }
  float sums[T];
  BATON_UNROLL
  for (int t = 0; t < T; ++t) sums[t] = HorizontalSum(_mm256_add_ps(acc0[t], acc1[t]));
  for (int t = 0; t < T; ++t) {  // the scalar tail, after the vector registers are done
    for (int64_t j = i; j < n; ++j) sums[t] = std::fma(ElementAt(dtype, w.p, j), x[t][j], sums[t]);
    out[t] = sums[t];
  }
}

template <typename Load>
void DotRowTokens(const Load& w, DType dtype, const float* const* x, int tokens, int64_t n,
                  float* out) {
  switch (tokens) {
    case 1:
      return DotRowAvx2<1>(w, dtype, x, n, out);
    case 2:
      return DotRowAvx2<2>(w, dtype, x, n, out);
    case 3:
      return DotRowAvx2<3>(w, dtype, x, n, out);
    default:
      return DotRowAvx2<4>(w, dtype, x, n, out);
  }
}

void DotRowAvx2Any(DType dtype, const uint8_t* w, const float* const* x, int tokens, int64_t n,
                   float* out) {
  if (dtype == DType::kBF16) return DotRowTokens(LoadBf16{w}, dtype, x, tokens, n, out);
  if (dtype == DType::kF16) return DotRowTokens(LoadF16{w}, dtype, x, tokens, n, out);
  DotRowTokens(LoadF32{w}, dtype, x, tokens, n, out);
}

float DotAvx2(const float* a, const float* b, int64_t n) {
  float out;
  DotRowAvx2<1>(LoadF32{reinterpret_cast<const uint8_t*>(a)}, DType::kF32, &b, n, &out);
  return out;
}

BATON_TARGET_AVX2 void AxpyAvx2(float a, const float* x, float* y, int64_t n) {
  const __m256 va = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  }
  for (; i < n; ++i) y[i] = std::fma(a, x[i], y[i]);
}

BATON_TARGET_AVX2 void ConvertAvx2(DType dtype, const uint8_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(dst + i, dtype == DType::kF16 ? LoadF16{src}(i) : LoadBf16{src}(i));
  }
  ConvertPortable(dtype, src + 2 * i, dst + i, n - i);
}

// AVX2, FMA and F16C by CPUID, and YMM state enabled by the OS (XGETBV).
bool CpuHasAvx2() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
  const bool fma = c & (1u << 12), osxsave = c & (1u << 27), f16c = c & (1u << 29);
  if (!fma || !osxsave || !f16c) return false;
  unsigned lo, hi;
  __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo & 0x6u) != 0x6u) return false;  // XMM and YMM state
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  return b & (1u << 5);
}

#else

bool CpuHasAvx2() { return false; }

#endif

// ---- dispatch ---------------------------------------------------------------------------

struct Kernels {
  float (*dot)(const float*, const float*, int64_t);
  void (*axpy)(float, const float*, float*, int64_t);
  void (*convert)(DType, const uint8_t*, float*, int64_t);
  // out[t] = dot(weight row at w (any alignment), x[t]) for t < tokens <= kMaxRowTokens.
  void (*dot_row)(DType, const uint8_t*, const float* const*, int, int64_t, float*);
  // Many inputs against 4-byte aligned fp32 rows (kernels_gemm.h); null: use dot_row.
  void (*gemm)(const float* const*, int64_t, const float*, int64_t, int64_t, float*, int64_t,
               int64_t);
};

Kernels PathKernels(KernelPath path) {
#if BATON_HAVE_AVX2_PATH
  if (path == KernelPath::kAvx2) {
    return {DotAvx2, AxpyAvx2, ConvertAvx2, DotRowAvx2Any, GemmRowsAvx2};
  }
#endif
  (void)path;
  return {DotPortable, AxpyPortable, ConvertPortable, DotRowPortable, nullptr};
}

KernelPath g_path = CpuHasAvx2() && KernelsAskedByEnvironment() != KernelsAsked::kPortable
                        ? KernelPath::kAvx2
                        : KernelPath::kPortable;
Kernels g_kernels = PathKernels(g_path);

// Rows per tile: converted rows reused across every input, about 64 KiB of them (measured
// best on the large model's shapes), at least 4 (one AVX-512 register block), a multiple of
// 4 where rows are short.
int64_t TileRows(int64_t cols) {
  const int64_t rows = std::clamp<int64_t>((64 << 10) / (4 * cols), 4, 64);
  return rows >= 8 ? rows / 4 * 4 : rows;
}

// All tokens against rows [r0, r0 + count), each row given as bytes of `dtype`.
void RowsTimesTokens(DType dtype, const uint8_t* const* rows, int64_t count, const Matrix& w,
                     const float* x, int64_t tokens, float* y, int64_t r0) {
  bool aligned = dtype == DType::kF32;
  for (int64_t r = 0; r < count && aligned; ++r) {
    aligned = reinterpret_cast<uintptr_t>(rows[r]) % alignof(float) == 0;
  }
  if (aligned && tokens >= kGemmMinTokens && g_kernels.gemm != nullptr) {
    return g_kernels.gemm(reinterpret_cast<const float* const*>(rows), count, x, tokens, w.cols, y,
                          w.rows, r0);
  }
  const float* xs[kMaxRowTokens];
  float out[kMaxRowTokens];
  for (int64_t t0 = 0; t0 < tokens; t0 += kMaxRowTokens) {
    const int n = static_cast<int>(std::min<int64_t>(kMaxRowTokens, tokens - t0));
    for (int t = 0; t < n; ++t) xs[t] = x + (t0 + t) * w.cols;
    for (int64_t r = 0; r < count; ++r) {
      g_kernels.dot_row(dtype, rows[r], xs, n, w.cols, out);
      for (int t = 0; t < n; ++t) y[(t0 + t) * w.rows + r0 + r] = out[t];
    }
  }
}

// With few tokens each weight row is read in place once; with more, a tile of rows is
// converted to fp32 first and reused across the tokens.
void MatMulTiles(const Matrix& w, const float* x, int64_t tokens, float* y, int64_t tile_begin,
                 int64_t tile_end) {
  const int64_t tile = TileRows(w.cols);
  const bool convert = w.dtype != DType::kF32 && tokens > 2;
  float* scratch = convert ? ThreadScratch(0, static_cast<size_t>(tile * w.cols)) : nullptr;
  const uint8_t* rows[64];
  const size_t row_bytes = static_cast<size_t>(w.cols) * DTypeSize(w.dtype);
  for (int64_t t = tile_begin; t < tile_end; ++t) {
    const int64_t r0 = t * tile;
    const int64_t count = std::min(tile, w.rows - r0);
    for (int64_t r = 0; r < count; ++r) {
      rows[r] = w.data + (r0 + r) * row_bytes;
      if (convert) {
        g_kernels.convert(w.dtype, rows[r], scratch + r * w.cols, w.cols);
        rows[r] = reinterpret_cast<const uint8_t*>(scratch + r * w.cols);
      }
    }
    RowsTimesTokens(convert ? DType::kF32 : w.dtype, rows, count, w, x, tokens, y, r0);
  }
}

}  // namespace

KernelPath ActiveKernelPath() { return g_path; }

bool SetKernelPath(KernelPath path) {
  if (path == KernelPath::kAvx2 && !CpuHasAvx2()) return false;
  g_path = path;
  g_kernels = PathKernels(path);
  return true;
}

float Dot(const float* a, const float* b, int64_t n) { return g_kernels.dot(a, b, n); }

void Axpy(float a, const float* x, float* y, int64_t n) { g_kernels.axpy(a, x, y, n); }

void ConvertToFloat(DType dtype, const uint8_t* src, float* dst, int64_t n) {
  if (dtype == DType::kF32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * 4);
  } else {
    g_kernels.convert(dtype, src, dst, n);
  }
}

const float* MatrixRow(const Matrix& m, int64_t r, float* scratch) {
  const uint8_t* row = m.data + static_cast<size_t>(r * m.cols) * DTypeSize(m.dtype);
  if (m.dtype == DType::kF32 && reinterpret_cast<uintptr_t>(row) % alignof(float) == 0) {
    return reinterpret_cast<const float*>(row);
  }
  ConvertToFloat(m.dtype, row, scratch, m.cols);
  return scratch;
}

void MatMul(const Matrix& w, const float* x, int64_t tokens, float* y, ComputePool* pool) {
  const int64_t tile = TileRows(w.cols);
  const int64_t tiles = (w.rows + tile - 1) / tile;
  auto run = [&](int64_t begin, int64_t end, int) { MatMulTiles(w, x, tokens, y, begin, end); };
  if (pool == nullptr) {
    run(0, tiles, 0);
    return;
  }
  // Split only when each piece has at least ~64k multiply-adds.
  const int64_t per_tile = std::max<int64_t>(1, tile * w.cols * tokens);
  pool->ParallelFor(tiles, std::max<int64_t>(1, (64 << 10) / per_tile), run);
}

void RmsNorm(const float* x, const float* weight, int64_t n, float eps, float* out) {
  const float mean_square = Dot(x, x, n) / static_cast<float>(n);
  const float scale = 1.0f / std::sqrt(mean_square + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = weight[i] * (x[i] * scale);
}

void SiluMul(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    gate[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

}  // namespace baton
