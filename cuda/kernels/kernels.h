// Kernels: Baton's device kernels (cuda/kernels/kernels_ptx.h) JIT-loaded into one context, with
// typed launchers. Launches are asynchronous on the given stream; wait with
// Stream::Synchronize. Move-only; owns the module. Thread-compatible (the context must be
// current on the calling thread).
#pragma once

#ifdef BATON_HAVE_CUDA_HEADERS

#include <cuda.h>

#include <cstdint>

#include "base/status.h"
#include "cuda/driver/cuda_handles.h"

namespace baton {

class Kernels {
 public:
  Kernels() = default;
  // Loads the embedded PTX into ctx (the JIT takes tens of milliseconds: do it at start-up,
  // never on the promotion path).
  static Result<Kernels> Load(const PrimaryContext& ctx);

  // Zeroes the first `header_bytes` (a multiple of 4) of `block_count` blocks of
  // `block_bytes` starting at `base` (4-byte aligned).
  Status ScrubHeaders(const Stream& stream, CUdeviceptr base, uint64_t block_bytes,
                      uint32_t header_bytes, uint32_t block_count) const;
  // One thread writing kSpinHeaderWord into header[0..header_words) and then n into *counter,
  // for n = 1..iterations.
  Status Spin(const Stream& stream, CUdeviceptr counter, CUdeviceptr header, uint32_t header_words,
              uint64_t iterations) const;
  // dst[i] = FillPatternWord(i, seed) for i < words.
  Status Fill(const Stream& stream, CUdeviceptr dst, uint64_t words, uint32_t seed) const;

 private:
  Status Launch(const Stream& stream, CUfunction f, unsigned grid, unsigned block, void** args,
                const char* name) const;

  const CudaDriver* driver_ = nullptr;
  Module module_;
  CUfunction scrub_ = nullptr;
  CUfunction spin_ = nullptr;
  CUfunction fill_ = nullptr;
};

}  // namespace baton

#endif  // BATON_HAVE_CUDA_HEADERS
