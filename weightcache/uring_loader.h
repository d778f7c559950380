// UringLoader: reads byte ranges of files into memory at the disk's speed.
//
// Reads use io_uring with O_DIRECT into registered (fixed) buffers: the destination region
// is registered in pieces of at most 1 GiB (the kernel's limit per buffer), requests of
// `chunk_size` bytes are kept `queue_depth` deep across all jobs (several files in flight
// at once), and short reads are resubmitted for the rest. Jobs must be 4096-byte aligned in
// file offset and destination; the caller (WeightCache) aligns data that does not start on
// a page boundary by reading from the page below. A read that reaches end of file early is
// not an error: the bytes past EOF are left zero. When io_uring cannot be set up, or the
// file system refuses O_DIRECT, the loader falls back (buffered io_uring, then pread) and
// reports the reason in LoadStats and the log. Not thread-safe; one Load at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/status.h"

namespace baton {

inline constexpr uint64_t kDirectIoAlignment = 4096;

struct LoadOptions {
  unsigned queue_depth = 32;
  uint64_t chunk_size = 4u << 20;
  bool use_uring = true;   // false: pread only (for comparison and fallback tests)
  bool direct = true;      // O_DIRECT
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
  uint64_t bytes = 0;        // bytes actually read
  double seconds = 0;
  double gbps = 0;           // bytes / seconds / 1e9
  std::string method;        // "io_uring+O_DIRECT", "io_uring", "pread+O_DIRECT", "pread"
  std::string fallback_reason;  // empty when the preferred method ran
};

class UringLoader {
 public:
  explicit UringLoader(LoadOptions options) : options_(std::move(options)) {}

  // Reads every job into its destination. `region`/`region_size` is the memory to register
  // (all destinations must be inside it).
  Result<LoadStats> Load(const std::vector<ReadJob>& jobs, uint8_t* region,
                         uint64_t region_size);

 private:
  LoadOptions options_;
};

}  // namespace baton
