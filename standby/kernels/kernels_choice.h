// Which kernels a process computes with: the best the CPU has, unless BATON_CPU_KERNELS asks
// for less, so that a host with AVX-512 computes as one without it would (an older or an AMD
// CPU), and a test suite run that way shows whether anything depends on this CPU's kernels:
//   "auto" or unset  the best the CPU has (AVX2 and FMA, with 512-bit register blocks in the
//                    matrix product where it has AVX-512F);
//   "avx2"           AVX2 and FMA with 256-bit blocks, no AVX-512;
//   "portable"       no SIMD path at all.
// The results are the same bits on every path for a given input order only within one path:
// a process uses one path throughout. An unknown value is said once on stderr and read as
// "auto"; a path the CPU lacks is not taken (the best it has below it is). Read once, at the
// first call (the kernels' start-up choice makes it). Thread-safe.
#pragma once

#include <string>

namespace baton {

enum class KernelsAsked { kBest, kAvx2, kPortable };

KernelsAsked KernelsAskedByEnvironment();
// `value` read as BATON_CPU_KERNELS (null: unset); an unknown one is said on stderr.
KernelsAsked ParseKernelsAsked(const char* value);

// The kernels in use, for an engine's start-up line: "avx2 with avx-512 blocks", "avx2" or
// "portable", and " (BATON_CPU_KERNELS=...)" when the environment asked for less.
std::string KernelsInUse();

}  // namespace baton
