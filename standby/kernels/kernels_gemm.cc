#include "standby/kernels/kernels_gemm.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "standby/kernels/kernels_choice.h"
#include "standby/kernels/kernels_simd.h"

namespace baton {

#if BATON_HAVE_AVX2_PATH

namespace {

constexpr int kMaxBlock = 4;             // rows or inputs per register block, at most
constexpr int64_t kL1Budget = 24 << 10;  // bytes of operands per inner-dimension block

// The inner-dimension block: a multiple of 16 whose slice of `count` rows and of one block
// of `tokens` inputs fits kL1Budget, so the rows stay in L1 while every input block passes.
int64_t InnerBlock(int64_t count, int tokens) {
  const int64_t fit = kL1Budget / (4 * (count + tokens));
  return std::clamp<int64_t>(fit / 16 * 16, 64, 4096);
}

float* AccScratch(size_t floats) {
  thread_local std::vector<float> acc;
  if (acc.size() < floats) acc.resize(floats);
  return acc.data();
}

// Accumulates elements [k0, k0 + len) (len a multiple of 16) of R rows x T inputs into the
// accumulators at acc[(row * tokens + token) * 16] (two 8-lane halves), zero when `first`.
template <int R, int T>
BATON_TARGET_AVX2 void Block(const float* const* w, const float* const* x, int64_t k0, int64_t len,
                             float* const* acc, bool first) {
  __m256 a0[R][T], a1[R][T];
  BATON_UNROLL
  for (int r = 0; r < R; ++r) {
    BATON_UNROLL
    for (int t = 0; t < T; ++t) {
      const float* a = acc[r * T + t];
      a0[r][t] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(a);
      a1[r][t] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(a + 8);
    }
  }
  for (int64_t i = k0; i < k0 + len; i += 16) {
    __m256 wv[R];
    BATON_UNROLL
    for (int r = 0; r < R; ++r) wv[r] = _mm256_loadu_ps(w[r] + i);
    BATON_UNROLL
    for (int t = 0; t < T; ++t) {
      const __m256 xv = _mm256_loadu_ps(x[t] + i);
      BATON_UNROLL
      for (int r = 0; r < R; ++r) a0[r][t] = _mm256_fmadd_ps(wv[r], xv, a0[r][t]);
    }
    BATON_UNROLL
    for (int r = 0; r < R; ++r) wv[r] = _mm256_loadu_ps(w[r] + i + 8);
    BATON_UNROLL
    for (int t = 0; t < T; ++t) {
      const __m256 xv = _mm256_loadu_ps(x[t] + i + 8);
      BATON_UNROLL
      for (int r = 0; r < R; ++r) a1[r][t] = _mm256_fmadd_ps(wv[r], xv, a1[r][t]);
    }
  }
  BATON_UNROLL
  for (int r = 0; r < R; ++r) {
    BATON_UNROLL
    for (int t = 0; t < T; ++t) {
      _mm256_storeu_ps(acc[r * T + t], a0[r][t]);
      _mm256_storeu_ps(acc[r * T + t] + 8, a1[r][t]);
    }
  }
}

// The same block with 512-bit registers where the CPU has AVX-512F: lanes 0-7 of a 16-lane
// accumulator are the first 8-lane accumulator above and lanes 8-15 the second, and one
// 16-lane FMA over elements i..i+15 is exactly the two 8-lane FMAs, so the arithmetic (and the
// result) is the same with half the instructions and loads.
template <int R, int T>
__attribute__((target("avx512f"))) void Block512(const float* const* w, const float* const* x,
                                                 int64_t k0, int64_t len, float* const* acc,
                                                 bool first) {
  __m512 a[R][T];
  BATON_UNROLL
  for (int r = 0; r < R; ++r) {
    BATON_UNROLL
    for (int t = 0; t < T; ++t) {
      a[r][t] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(acc[r * T + t]);
    }
  }
  for (int64_t i = k0; i < k0 + len; i += 16) {
    __m512 wv[R];
    BATON_UNROLL
    for (int r = 0; r < R; ++r) wv[r] = _mm512_loadu_ps(w[r] + i);
    BATON_UNROLL
    for (int t = 0; t < T; ++t) {
      const __m512 xv = _mm512_loadu_ps(x[t] + i);
      BATON_UNROLL
      for (int r = 0; r < R; ++r) a[r][t] = _mm512_fmadd_ps(wv[r], xv, a[r][t]);
    }
  }
  BATON_UNROLL
  for (int r = 0; r < R; ++r) {
    BATON_UNROLL
    for (int t = 0; t < T; ++t) _mm512_storeu_ps(acc[r * T + t], a[r][t]);
  }
}

using BlockFn = void (*)(const float* const*, const float* const*, int64_t, int64_t, float* const*,
                         bool);

// Register blocking: AVX2 blocks of 2 rows x 3 inputs (12 accumulators, 2 rows and 1 input:
// 15 of the 16 YMM registers); AVX-512 blocks of 4 x 4 (16 + 4 + 1 of the 32 ZMM registers).
struct Blocking {
  int rows;
  int tokens;
  BlockFn fns[kMaxBlock][kMaxBlock];  // [rows - 1][tokens - 1]
};

template <template <int, int> class K, int R, int... Ts>
void Fill(BlockFn (&row)[kMaxBlock]) {
  ((row[Ts - 1] = &K<R, Ts>::Run), ...);
}

template <int R, int T>
struct Avx2Block {
  static void Run(const float* const* w, const float* const* x, int64_t k0, int64_t len,
                  float* const* acc, bool first) {
    Block<R, T>(w, x, k0, len, acc, first);
  }
};
template <int R, int T>
struct Avx512Block {
  static void Run(const float* const* w, const float* const* x, int64_t k0, int64_t len,
                  float* const* acc, bool first) {
    Block512<R, T>(w, x, k0, len, acc, first);
  }
};

Blocking MakeAvx512Blocking() {
  Blocking b{};
  b.rows = b.tokens = 4;
  Fill<Avx512Block, 1, 1, 2, 3, 4>(b.fns[0]);
  Fill<Avx512Block, 2, 1, 2, 3, 4>(b.fns[1]);
  Fill<Avx512Block, 3, 1, 2, 3, 4>(b.fns[2]);
  Fill<Avx512Block, 4, 1, 2, 3, 4>(b.fns[3]);
  return b;
}

Blocking MakeAvx2Blocking() {
  Blocking b{};
  b.rows = 2;
  b.tokens = 3;
  Fill<Avx2Block, 1, 1, 2, 3>(b.fns[0]);
  Fill<Avx2Block, 2, 1, 2, 3>(b.fns[1]);
  return b;
}

bool CpuHasAvx512() { return __builtin_cpu_supports("avx512f"); }

const Blocking kAvx512Blocking = MakeAvx512Blocking();
const Blocking kAvx2Blocking = MakeAvx2Blocking();
const Blocking* g_blocking = CpuHasAvx512() && KernelsAskedByEnvironment() == KernelsAsked::kBest
                                 ? &kAvx512Blocking
                                 : &kAvx2Blocking;

const Blocking& ChooseBlocking() { return *g_blocking; }

// The end of one dot product, as in the one-row kernel: the 8-element step, the horizontal
// sum, the scalar tail.
BATON_TARGET_AVX2 float Finish(const float* w, const float* x, int64_t main, int64_t cols,
                               const float* acc) {
  __m256 a0 = _mm256_loadu_ps(acc);
  const __m256 a1 = _mm256_loadu_ps(acc + 8);
  int64_t i = main;
  if (i + 8 <= cols) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
    i += 8;
  }
  float sum = HorizontalSum(_mm256_add_ps(a0, a1));
  for (; i < cols; ++i) sum = std::fma(w[i], x[i], sum);
  return sum;
}

}  // namespace

bool UseAvx512Blocks(bool on) {
  if (on && !CpuHasAvx512()) return false;
  g_blocking = on ? &kAvx512Blocking : &kAvx2Blocking;
  return true;
}

bool Avx512BlocksInUse() { return g_blocking == &kAvx512Blocking; }

void GemmRowsAvx2(const float* const* rows, int64_t count, const float* x, int64_t tokens,
                  int64_t cols, float* y, int64_t ld_y, int64_t r0) {
  const int64_t main = cols / 16 * 16;
  float* acc = AccScratch(static_cast<size_t>(count * tokens * 16));
  if (main == 0) std::fill(acc, acc + count * tokens * 16, 0.0f);
  const Blocking& b = ChooseBlocking();
  const int64_t inner = InnerBlock(count, b.tokens);
  for (int64_t k0 = 0; k0 < main; k0 += inner) {
    const int64_t len = std::min(inner, main - k0);
    for (int64_t t = 0; t < tokens; t += b.tokens) {
      const int nt = static_cast<int>(std::min<int64_t>(b.tokens, tokens - t));
      const float* xs[kMaxBlock];
      for (int j = 0; j < nt; ++j) xs[j] = x + (t + j) * cols;
      for (int64_t r = 0; r < count; r += b.rows) {
        const int nr = static_cast<int>(std::min<int64_t>(b.rows, count - r));
        float* accs[kMaxBlock * kMaxBlock];
        for (int i = 0; i < nr; ++i) {
          for (int j = 0; j < nt; ++j) accs[i * nt + j] = acc + ((r + i) * tokens + t + j) * 16;
        }
        b.fns[nr - 1][nt - 1](rows + r, xs, k0, len, accs, k0 == 0);
      }
    }
  }
  for (int64_t r = 0; r < count; ++r) {
    for (int64_t t = 0; t < tokens; ++t) {
      y[t * ld_y + r0 + r] = Finish(rows[r], x + t * cols, main, cols, acc + (r * tokens + t) * 16);
    }
  }
}

#else

bool UseAvx512Blocks(bool on) { return !on; }
bool Avx512BlocksInUse() { return false; }
void GemmRowsAvx2(const float* const*, int64_t, const float*, int64_t, int64_t, float*, int64_t,
                  int64_t) {}

#endif

}  // namespace baton
