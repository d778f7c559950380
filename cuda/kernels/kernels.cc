#include "cuda/kernels/kernels.h"

#ifdef BATON_HAVE_CUDA_HEADERS

#include <algorithm>

#include "cuda/kernels/kernels_ptx.h"

namespace baton {
namespace {

constexpr unsigned kThreads = 256;

unsigned GridFor(uint64_t items, unsigned max_blocks) {
  const uint64_t blocks = (items + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::clamp<uint64_t>(blocks, 1, max_blocks));
}

}  // namespace

Result<Kernels> Kernels::Load(const PrimaryContext& ctx) {
  BATON_RETURN_IF_ERROR(ctx.MakeCurrent());
  Kernels k;
  k.driver_ = &ctx.driver();
  BATON_ASSIGN_OR_RETURN(k.module_, Module::LoadPtx(ctx.driver(), kBatonKernelsPtx));
  BATON_ASSIGN_OR_RETURN(k.scrub_, k.module_.Function(kScrubHeadersKernel));
  BATON_ASSIGN_OR_RETURN(k.spin_, k.module_.Function(kSpinKernel));
  BATON_ASSIGN_OR_RETURN(k.fill_, k.module_.Function(kFillKernel));
  return k;
}

Status Kernels::Launch(const Stream& stream, CUfunction f, unsigned grid, unsigned block,
                       void** args, const char* name) const {
  if (driver_ == nullptr) return FailedPrecondition("kernels not loaded");
  return BATON_CU(*driver_, cuLaunchKernel, f, grid, 1, 1, block, 1, 1, 0, stream.get(), args,
                  nullptr)
      .WithContext(name);
}

Status Kernels::ScrubHeaders(const Stream& stream, CUdeviceptr base, uint64_t block_bytes,
                             uint32_t header_bytes, uint32_t block_count) const {
  if (header_bytes == 0 || header_bytes % 4 != 0 || header_bytes > block_bytes ||
      block_bytes % 4 != 0 || base % 4 != 0) {
    return InvalidArgument("scrub: header_bytes " + std::to_string(header_bytes) +
                           " must be a positive multiple of 4 within 4-aligned blocks of " +
                           std::to_string(block_bytes) + " bytes");
  }
  if (block_count == 0) return OkStatus();
  uint32_t header_words = header_bytes / 4;
  void* args[] = {&base, &block_bytes, &header_words, &block_count};
  return Launch(stream, scrub_, GridFor(uint64_t{header_words} * block_count, 1024), kThreads, args,
                kScrubHeadersKernel);
}

Status Kernels::Spin(const Stream& stream, CUdeviceptr counter, CUdeviceptr header,
                     uint32_t header_words, uint64_t iterations) const {
  if (counter % 8 != 0 || header % 4 != 0) {
    return InvalidArgument("spin: counter must be 8-aligned and header 4-aligned");
  }
  void* args[] = {&counter, &header, &header_words, &iterations};
  return Launch(stream, spin_, 1, 1, args, kSpinKernel);
}

Status Kernels::Fill(const Stream& stream, CUdeviceptr dst, uint64_t words, uint32_t seed) const {
  if (dst % 4 != 0) return InvalidArgument("fill: destination must be 4-aligned");
  if (words == 0) return OkStatus();
  void* args[] = {&dst, &words, &seed};
  return Launch(stream, fill_, GridFor(words, 8192), kThreads, args, kFillKernel);
}

}  // namespace baton

#endif  // BATON_HAVE_CUDA_HEADERS
