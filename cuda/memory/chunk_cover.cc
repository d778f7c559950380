#include "cuda/memory/chunk_cover.h"

#include <algorithm>
#include <numeric>
#include <string>

namespace baton {

Result<ChunkCover> ChunkCover::Create(uint32_t block_count, uint32_t blocks_per_chunk,
                                      uint32_t chunk_count) {
  if (blocks_per_chunk == 0) return InvalidArgument("chunk cover: 0 blocks per chunk");
  if (uint64_t{blocks_per_chunk} * chunk_count < block_count) {
    return InvalidArgument("chunk cover: " + std::to_string(chunk_count) + " chunks of " +
                           std::to_string(blocks_per_chunk) + " blocks do not hold " +
                           std::to_string(block_count) + " blocks");
  }
  ChunkCover c;
  c.block_count_ = block_count;
  c.blocks_per_chunk_ = blocks_per_chunk;
  c.held_per_chunk_.assign(chunk_count, 0);
  c.held_.assign(block_count, false);
  c.read_only_.assign(chunk_count, false);
  return c;
}

Status ChunkCover::CheckRange(uint32_t first, uint32_t count) const {
  if (count == 0 || first >= block_count_ || count > block_count_ - first) {
    return InvalidArgument("blocks [" + std::to_string(first) + ", +" + std::to_string(count) +
                           ") are outside the pool of " + std::to_string(block_count_));
  }
  return OkStatus();
}

Result<std::vector<ChunkSpan>> ChunkCover::Add(uint32_t first, uint32_t count,
                                               std::vector<ChunkSpan>* upgraded) {
  BATON_RETURN_IF_ERROR(CheckRange(first, count));
  for (uint32_t b = first; b < first + count; ++b) {
    if (held_[b]) return FailedPrecondition("block " + std::to_string(b) + " is already held");
  }
  std::vector<uint32_t> newly;
  std::vector<uint32_t> were_read;
  for (uint32_t b = first; b < first + count; ++b) {
    held_[b] = true;
    const uint32_t c = b / blocks_per_chunk_;
    if (held_per_chunk_[c]++ != 0) continue;
    if (read_only_[c]) {
      read_only_[c] = false;
      were_read.push_back(c);
    } else {
      newly.push_back(c);
    }
  }
  *upgraded = Spans(were_read);
  return Spans(newly);
}

Result<std::vector<ChunkSpan>> ChunkCover::AddReadOnly(uint32_t first, uint32_t count) {
  BATON_RETURN_IF_ERROR(CheckRange(first, count));
  std::vector<uint32_t> newly;
  const uint32_t last = (first + count - 1) / blocks_per_chunk_;
  for (uint32_t c = first / blocks_per_chunk_; c <= last; ++c) {
    if (held_per_chunk_[c] > 0 || read_only_[c]) continue;
    read_only_[c] = true;
    newly.push_back(c);
  }
  return Spans(newly);
}

std::vector<ChunkSpan> ChunkCover::DropReadOnly() {
  std::vector<uint32_t> read;
  for (uint32_t c = 0; c < read_only_.size(); ++c) {
    if (read_only_[c]) read.push_back(c);
  }
  read_only_.assign(read_only_.size(), false);
  return Spans(read);
}

void ChunkCover::ForgetReadOnly(const std::vector<ChunkSpan>& spans) {
  for (const ChunkSpan& s : spans) {
    for (uint32_t c = s.first; c < s.first + s.count; ++c) read_only_[c] = false;
  }
}

Result<std::vector<ChunkSpan>> ChunkCover::Remove(uint32_t first, uint32_t count) {
  BATON_RETURN_IF_ERROR(CheckRange(first, count));
  for (uint32_t b = first; b < first + count; ++b) {
    if (!held_[b]) return FailedPrecondition("block " + std::to_string(b) + " is not held");
  }
  std::vector<uint32_t> emptied;
  for (uint32_t b = first; b < first + count; ++b) {
    held_[b] = false;
    const uint32_t c = b / blocks_per_chunk_;
    if (--held_per_chunk_[c] == 0) emptied.push_back(c);
  }
  return Spans(emptied);
}

uint32_t ChunkCover::mapped_chunks() const {
  uint32_t n = 0;
  for (uint32_t held : held_per_chunk_) n += held > 0 ? 1 : 0;
  return n;
}

uint32_t ChunkCover::read_only_chunks() const {
  return static_cast<uint32_t>(std::count(read_only_.begin(), read_only_.end(), true));
}

uint32_t ChunkCover::held_blocks() const {
  return std::accumulate(held_per_chunk_.begin(), held_per_chunk_.end(), 0u);
}

std::vector<ChunkSpan> ChunkCover::Spans(const std::vector<uint32_t>& chunks) {
  std::vector<ChunkSpan> out;
  for (uint32_t c : chunks) {
    if (!out.empty() && out.back().first + out.back().count == c) {
      ++out.back().count;
    } else {
      out.push_back({c, 1});
    }
  }
  return out;
}

}  // namespace baton
