// UringLoader: reads byte ranges of files into memory at the disk's speed.
//
// Reads use io_uring with O_DIRECT into registered (fixed) buffers: the destination region
// is registered in pieces of at most 1 GiB (the kernel's limit per buffer), requests of
// `chunk_size` bytes are kept `queue_depth` deep across all jobs (several files in flight
// at once), and short reads are resubmitted for the rest. Jobs must be 4096-byte aligned in
// file offset and destination; the caller (WeightCache) aligns data that does not start on
// a page boundary by reading from the page below. A read that reaches end of file early is
// not an error: the bytes past EOF are left zero. With O_DIRECT the last block of a job
// that ends at end of file is read whole, so a job may write (zeros) up to its end rounded
// up to 4096 when that stays inside the region; a partial last block that does not end at
// end of file, or the rest of a short read that is not block aligned, is read with a
// buffered pread. When io_uring cannot be set up, the file system refuses O_DIRECT, or the
// region cannot be registered, the loader falls back (pread; buffered reads; unregistered
// reads) and reports the reason in LoadStats and the log. Load() returns only once no read
// is in flight, error or not (except when io_uring_enter itself fails: then the kernel
// cancels what is left as the ring closes, and the pages stay pinned until it has).
// Not thread-safe; one Load at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/status.h"

namespace baton {

inline constexpr uint64_t kDirectIoAlignment = 4096;

struct LoadOptions {
  unsigned queue_depth = 32;       // requests in flight, across all files
  uint64_t chunk_size = 4u << 20;  // bytes per request; a multiple of kDirectIoAlignment
  bool use_uring = true;           // false: pread only (for comparison and fallback tests)
  bool direct = true;              // O_DIRECT
  unsigned files_in_flight = 4;    // jobs read side by side (requests alternate between them)
  // The region is registered with io_uring in buffers of at most this many bytes (the
  // kernel's limit is 1 GiB); requests never straddle two. Tests shrink it.
  uint64_t max_registered_buffer = 1ull << 30;
  const Clock* clock = nullptr;  // for the elapsed time; nullptr: RealClock::Get()
  // Called from the loading thread as bytes complete (bytes done, bytes total).
  std::function<void(uint64_t, uint64_t)> progress;
};

struct ReadJob {
  std::string path;
  uint64_t file_offset = 0;  // multiple of kDirectIoAlignment
  uint64_t length = 0;       // bytes wanted; may run past EOF
  uint8_t* dest = nullptr;   // multiple of kDirectIoAlignment, inside the region
};

struct LoadStats {
  uint64_t bytes = 0;  // bytes actually read
  double seconds = 0;
  double gbps = 0;              // bytes / seconds / 1e9
  std::string method;           // "io_uring+O_DIRECT", "io_uring", "pread+O_DIRECT", "pread"
  std::string fallback_reason;  // empty when the preferred method ran
  bool operator==(const LoadStats&) const = default;
};

class UringLoader {
 public:
  explicit UringLoader(LoadOptions options) : options_(std::move(options)) {}

  // Reads every job into its destination. `region`/`region_size` is the memory to register
  // (all destinations must be inside it).
  Result<LoadStats> Load(const std::vector<ReadJob>& jobs, uint8_t* region, uint64_t region_size);

 private:
  LoadOptions options_;
};

}  // namespace baton
