// Internal to the compute core: the AVX2 (and, where present, AVX-512) matrix product of fp32
// weight rows with several input rows (prefill), register-blocked and cut along the inner dimension
// so that the operands stay in the L1 cache.
//
// Each output is the same sequence of fp32 operations as the AVX2 dot product of
// standby/kernels/kernels.cc (two 8-lane FMA accumulators over 16-element steps in order, one
// 8-element step into the first, the horizontal sum of their sum, then a scalar FMA tail):
// the accumulators of a (row, input) pair are kept in memory between inner-dimension
// blocks, which changes when they are updated, never in what order. So a token's result is
// bitwise the same here as in the one-row kernels, whatever the batch.
#pragma once

#include <cstdint>

namespace baton {

// y[t * ld_y + r0 + r] = dot(rows[r], x + t * cols) for r < count, t < tokens. Rows are
// 4-byte aligned fp32. Thread-safe (per-thread scratch). Only on the AVX2 path.
void GemmRowsAvx2(const float* const* rows, int64_t count, const float* x, int64_t tokens,
                  int64_t cols, float* y, int64_t ld_y, int64_t r0);

// 512-bit register blocks (4 rows x 4 inputs) where the CPU has AVX-512F, else 256-bit ones
// (2 x 3); the results are the same. Chosen at start-up by CPUID; tests switch to compare
// them. False when `on` and the CPU lacks AVX-512F. Call while no kernel runs.
bool UseAvx512Blocks(bool on);
// Whether the 512-bit blocks are the ones in use.
bool Avx512BlocksInUse();

}  // namespace baton
