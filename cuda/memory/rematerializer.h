// Rematerializer: rebuilds the device copy of the weights from the pinned host cache when it
// is lost (GPU reset, first start), with chunked cuMemcpyHtoDAsync on several streams so the
// copy engines stay busy; PlainPinnedCopy() is the baseline it is measured against (one
// synchronous cuMemcpyHtoD of the whole range, or of each `piece` bytes of it). The source
// must be pinned (PinnedHostCache) or the driver stages it through bounce buffers at a
// fraction of the speed; a copy whose host side starts in one cuMemHostRegister registration
// and runs past its end is refused by the driver (CUDA_ERROR_INVALID_VALUE), so a registered
// cache is copied in pieces that each lie in one registration (PinnedHostCache::copy_unit():
// Copy's `unit`, PlainPinnedCopy's `piece`).
// Move-only; owns its streams. Thread-compatible (the context must be current).
#pragma once

#ifdef BATON_HAVE_CUDA_HEADERS

#include <cuda.h>

#include <cstdint>
#include <vector>

#include "base/clock.h"
#include "base/status.h"
#include "cuda/driver/cuda_handles.h"

namespace baton {

struct RematOptions {
  int streams = 4;
  uint64_t chunk_bytes = 64ull << 20;
  Duration timeout = std::chrono::seconds(120);
};

struct CopyStats {
  uint64_t bytes = 0;
  int streams = 0;
  uint64_t chunk_bytes = 0;
  uint64_t copies = 0;  // cuMemcpy calls
  double ms = 0;        // enqueue of the first copy to completion of the last
  double gbps = 0;      // bytes / 1e9 per second
};

class Rematerializer {
 public:
  Rematerializer() = default;
  static Result<Rematerializer> Create(const PrimaryContext& ctx, const RematOptions& options);
  // Copies [src, src + bytes) to dst and waits for it. `unit` > 0: no copy crosses a multiple
  // of `unit` bytes from src (the source's registrations: PinnedHostCache::copy_unit()), so a
  // chunk that would is cut there.
  Result<CopyStats> Copy(CUdeviceptr dst, const uint8_t* src, uint64_t bytes,
                         uint64_t unit = 0) const;

 private:
  const PrimaryContext* ctx_ = nullptr;
  RematOptions options_;
  std::vector<Stream> streams_;
};

// `piece` 0: one copy of `bytes`.
Result<CopyStats> PlainPinnedCopy(const PrimaryContext& ctx, CUdeviceptr dst, const uint8_t* src,
                                  uint64_t bytes, uint64_t piece = 0);

}  // namespace baton

#endif  // BATON_HAVE_CUDA_HEADERS
