// Kernels: the arithmetic of the compute core, in fp32, over weights used in place.
//
// A Matrix is a row-major [rows, cols] weight (an HF Linear's [out, in]) in F32, F16 or
// BF16, read where it lies. MatMul converts each weight row to fp32 once per call (exact:
// every F16 and BF16 value is a float) and takes its dot product with each input row. Every
// output element is one Dot() over the same operands in the same order whatever the batch,
// the tiling or the thread count, so a token's result is bitwise the same whether it is
// computed alone, in a prefill or in a batch. Dot and Axpy have an AVX2+FMA path, chosen at
// start-up when the CPU has it, and a portable path; a process uses one path throughout.
// Free functions; thread-safe (scratch space is per thread).
#pragma once

#include <cstddef>
#include <cstdint>

#include "weightcache/safetensors/dtype.h"

namespace baton {

class ComputePool;

struct Matrix {
  DType dtype = DType::kF32;  // kF32, kF16 or kBF16
  int64_t rows = 0;
  int64_t cols = 0;
  const uint8_t* data = nullptr;
};

enum class KernelPath { kPortable, kAvx2 };
KernelPath ActiveKernelPath();
// Selects the path (tests compare them); false when the CPU lacks it. Call before any
// compute starts, never while kernels run.
bool SetKernelPath(KernelPath path);

float Dot(const float* a, const float* b, int64_t n);
// y += a * x
void Axpy(float a, const float* x, float* y, int64_t n);

// Converts n elements of `dtype` at `src` (any alignment) to floats.
void ConvertToFloat(DType dtype, const uint8_t* src, float* dst, int64_t n);
// Row r of m as floats: the weight bytes themselves for a 4-byte-aligned F32 matrix,
// otherwise converted into `scratch` (m.cols floats).
const float* MatrixRow(const Matrix& m, int64_t r, float* scratch);

// y[t * w.rows + r] = Dot(row r of w, x + t * w.cols) for t < tokens. `pool` may be null.
void MatMul(const Matrix& w, const float* x, int64_t tokens, float* y, ComputePool* pool);

// out = x / sqrt(mean(x^2) + eps) * weight (weight is n floats). out may equal x.
void RmsNorm(const float* x, const float* weight, int64_t n, float eps, float* out);
// gate[i] = silu(gate[i]) * up[i]
void SiluMul(float* gate, const float* up, int64_t n);

}  // namespace baton
