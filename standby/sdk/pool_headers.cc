// PoolMapping::ReadHeaders: the header bytes of many pool blocks, copied from the header view
// or, without one, read from the pool's file.
//
// Without the view, one pread per block: a block's header is its first bytes and blocks are
// megabytes apart, so no vectored read gathers them, and a pread costs less than the page
// fault a mapping made at the promotion would take (0.4-0.9 us against 1-3 us per block,
// measured on a 2-core VM); the view's pages were faulted in before. The blocks are split
// into equal slices of the flat block order, the first read on the calling thread, the others
// each on a thread of its own; a thread that cannot be started leaves its slice to the caller.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include "standby/sdk/pool_mapping.h"

namespace baton {
namespace {

struct RunError {
  size_t run = 0;
  Status status;
};

// Calls read(from, to, slice) over `slices` equal slices of [0, total), the first on this
// thread and each other on a thread of its own (on this one if it cannot be started). `read`
// must not throw; every thread started is joined.
template <typename Read>
void ReadInSlices(uint64_t total, uint64_t slices, const Read& read) {
  std::vector<std::thread> workers;
  std::vector<uint64_t> here;
  workers.reserve(slices);  // no reallocation below, so nothing throws with a thread running
  here.reserve(slices);
  here.push_back(0);
  for (uint64_t s = 1; s < slices; ++s) {
    try {
      workers.emplace_back(
          [&read, total, slices, s] { read(total * s / slices, total * (s + 1) / slices, s); });
    } catch (...) {  // no thread (system_error) or no memory for its state
      here.push_back(s);
    }
  }
  for (uint64_t s : here) read(total * s / slices, total * (s + 1) / slices, s);
  for (std::thread& t : workers) t.join();
}

// Moves the headers of the runs that read whole down over those of the failed ones, in
// place; `start` as in ReadHeaders. Returns how many blocks' headers remain.
uint64_t DropFailedRuns(const std::vector<uint64_t>& start, const std::vector<Status>& status,
                        uint64_t header_bytes, uint8_t* headers) {
  uint64_t kept = 0;
  for (size_t r = 0; r < status.size(); ++r) {
    const uint64_t blocks = start[r + 1] - start[r];
    if (blocks == 0 || !status[r].ok()) continue;
    if (kept != start[r]) {
      std::memmove(headers + kept * header_bytes, headers + start[r] * header_bytes,
                   blocks * header_bytes);
    }
    kept += blocks;
  }
  return kept;
}

}  // namespace

std::vector<Status> PoolMapping::ReadHeaders(std::span<const BlockRun> runs, uint64_t header_bytes,
                                             unsigned threads, std::vector<uint8_t>* out) const {
  std::vector<Status> status(runs.size());
  // start[r]: the flat index of run r's first block; a refused run holds none.
  std::vector<uint64_t> start(runs.size() + 1, 0);
  for (size_t r = 0; r < runs.size(); ++r) {
    status[r] = CheckRange(runs[r].first, runs[r].count);
    start[r + 1] = start[r] + (status[r].ok() ? runs[r].count : 0);
  }
  const uint64_t total = start.back();
  const size_t base = out->size();
  out->resize(base + total * header_bytes, 0);
  uint8_t* headers = out->data() + base;
  const uint64_t n = std::min(header_bytes, args_.block_bytes);
  // A copy from the view costs a tenth of a pread: a thread pays for itself on more blocks.
  const uint64_t per_thread =
      header_view_ != nullptr ? kViewBlocksPerThread : uint64_t{kHeaderBlocksPerThread};
  const uint64_t slices = std::clamp<uint64_t>(total / per_thread, 1, std::max(1u, threads));
  std::vector<std::vector<RunError>> errors(slices);
  std::vector<uint8_t> slice_failed(slices, 0);  // a slice that threw (out of memory)
  // Reads flat blocks [from, to); a run whose read failed is not read further.
  ReadInSlices(total, slices, [&](uint64_t from, uint64_t to, uint64_t slice) {
    try {
      std::vector<RunError>& failed = errors[slice];
      auto r = static_cast<size_t>(std::upper_bound(start.begin(), start.end(), from) -
                                   start.begin() - 1);
      for (uint64_t i = from; i < to; ++i) {
        while (start[r + 1] <= i) ++r;
        if (!failed.empty() && failed.back().run == r) continue;
        const uint32_t block = runs[r].first + static_cast<uint32_t>(i - start[r]);
        if (header_view_ != nullptr) {
          std::memcpy(headers + i * header_bytes,
                      header_view_ + uint64_t{block} * args_.block_bytes, n);
          continue;
        }
        const ssize_t got = ::pread(fd_.get(), headers + i * header_bytes, n,
                                    static_cast<off_t>(uint64_t{block} * args_.block_bytes));
        const int error = errno;
        if (got == static_cast<ssize_t>(n)) continue;
        const std::string what = "the header of pool block " + std::to_string(block);
        failed.push_back(
            {r, got < 0 ? ErrnoStatus("reading " + what, error)
                        : DataLoss(what + " is short: " + std::to_string(got) + " bytes")});
      }
    } catch (...) {
      slice_failed[slice] = 1;
    }
  });
  for (uint64_t slice = 0; slice < slices; ++slice) {
    if (slice_failed[slice] == 0) continue;
    for (size_t r = 0; r < runs.size(); ++r) {  // the runs that share the slice's blocks
      if (start[r] < total * (slice + 1) / slices && start[r + 1] > total * slice / slices) {
        status[r] =
            Internal("reading the headers of pool blocks [" + std::to_string(runs[r].first) +
                     ", +" + std::to_string(runs[r].count) + "): out of memory");
      }
    }
  }
  for (const std::vector<RunError>& slice : errors) {
    for (const RunError& e : slice) {
      if (status[e.run].ok()) status[e.run] = e.status;
    }
  }
  out->resize(base + DropFailedRuns(start, status, header_bytes, headers) * header_bytes);
  return status;
}

}  // namespace baton
