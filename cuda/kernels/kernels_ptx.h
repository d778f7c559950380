// The PTX text of Baton's device kernels (see kernels_ptx.cc for their CUDA C source):
//   baton_scrub_headers(u8* base, u64 block_bytes, u32 header_words, u32 block_count)
//     zeroes the first header_words 32-bit words of each block: the promotion barrier.
//   baton_spin(u64* counter, u32* header, u32 header_words, u64 iterations)
//     one thread that keeps writing a block header and a counter: the "killed in the middle
//     of a kernel" drill.
//   baton_fill_u32(u32* dst, u64 words, u32 seed)
//     dst[i] = u32(i x 2654435761) ^ seed: a pattern the host can check (FillPatternWord).
// Needs no CUDA headers. Immutable data; thread-safe.
#pragma once

#include <cstdint>

namespace baton {

extern const char kBatonKernelsPtx[];

inline constexpr const char* kScrubHeadersKernel = "baton_scrub_headers";
inline constexpr const char* kSpinKernel = "baton_spin";
inline constexpr const char* kFillKernel = "baton_fill_u32";

// The word baton_fill_u32 writes at `index`.
inline uint32_t FillPatternWord(uint64_t index, uint32_t seed) {
  return static_cast<uint32_t>(index * 2654435761ull) ^ seed;
}

// The value baton_spin writes into each header word.
inline constexpr uint32_t kSpinHeaderWord = 0xBADC0DEu;

}  // namespace baton
