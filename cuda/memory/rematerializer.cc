#include "cuda/memory/rematerializer.h"

#ifdef BATON_HAVE_CUDA_HEADERS

#include <algorithm>

namespace baton {
namespace {

void Finish(CopyStats* stats, TimePoint start) {
  stats->ms = MillisBetween(start, RealClock::Get().Now());
  stats->gbps = stats->ms > 0 ? static_cast<double>(stats->bytes) / 1e6 / stats->ms : 0;
}

}  // namespace

Result<Rematerializer> Rematerializer::Create(const PrimaryContext& ctx,
                                              const RematOptions& options) {
  if (options.streams < 1 || options.streams > 64 || options.chunk_bytes == 0) {
    return InvalidArgument("rematerializer: streams must be in [1, 64] and chunk_bytes > 0");
  }
  BATON_RETURN_IF_ERROR(ctx.MakeCurrent());
  Rematerializer r;
  r.ctx_ = &ctx;
  r.options_ = options;
  for (int i = 0; i < options.streams; ++i) {
    BATON_ASSIGN_OR_RETURN(Stream s, Stream::Create(ctx.driver()));
    r.streams_.push_back(std::move(s));
  }
  return r;
}

Result<CopyStats> Rematerializer::Copy(CUdeviceptr dst, const uint8_t* src, uint64_t bytes,
                                       uint64_t unit) const {
  if (ctx_ == nullptr) return FailedPrecondition("rematerializer not created");
  BATON_RETURN_IF_ERROR(ctx_->MakeCurrent());
  const CudaDriver& cu = ctx_->driver();
  CopyStats stats{.bytes = bytes,
                  .streams = static_cast<int>(streams_.size()),
                  .chunk_bytes = options_.chunk_bytes};
  const TimePoint start = RealClock::Get().Now();
  for (uint64_t at = 0, n = 0; at < bytes; at += n) {
    n = std::min(options_.chunk_bytes, bytes - at);
    if (unit > 0) n = std::min(n, unit - at % unit);
    const Stream& s = streams_[stats.copies % streams_.size()];
    BATON_RETURN_IF_ERROR(BATON_CU(cu, cuMemcpyHtoDAsync, dst + at, src + at, n, s.get())
                              .WithContext("rematerializing bytes [" + std::to_string(at) + ", +" +
                                           std::to_string(n) + ")"));
    ++stats.copies;
  }
  const TimePoint deadline = start + options_.timeout;
  for (const Stream& s : streams_) {
    const Duration left = std::max(Duration::zero(), deadline - RealClock::Get().Now());
    BATON_RETURN_IF_ERROR(s.Synchronize(left).WithContext("rematerialization"));
  }
  Finish(&stats, start);
  return stats;
}

Result<CopyStats> PlainPinnedCopy(const PrimaryContext& ctx, CUdeviceptr dst, const uint8_t* src,
                                  uint64_t bytes, uint64_t piece) {
  BATON_RETURN_IF_ERROR(ctx.MakeCurrent());
  if (piece == 0 || piece > bytes) piece = bytes;
  CopyStats stats{.bytes = bytes, .streams = 1, .chunk_bytes = piece, .copies = 0};
  const TimePoint start = RealClock::Get().Now();
  for (uint64_t at = 0; at < bytes; at += piece, ++stats.copies) {
    BATON_RETURN_IF_ERROR(
        BATON_CU(ctx.driver(), cuMemcpyHtoD, dst + at, src + at, std::min(piece, bytes - at)));
  }
  Finish(&stats, start);
  return stats;
}

}  // namespace baton

#endif  // BATON_HAVE_CUDA_HEADERS
