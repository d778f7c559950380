#include "standby/sdk/pool_mapping.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "base/align.h"
#include "proto/transport/shared_memory.h"

namespace baton {
namespace {

constexpr int kReserveFlags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;

std::string BlockText(uint32_t first, uint32_t count) {
  return "blocks [" + std::to_string(first) + ", " + std::to_string(uint64_t{first} + count) + ")";
}

Status CheckGeometry(const PoolGeometryArgs& args, uint64_t fd_size) {
  if (args.block_count == 0 || args.block_bytes == 0) {
    return InvalidArgument("pool geometry: block_count and block_bytes must be positive");
  }
  if (args.huge_pages && args.block_bytes % kHugePageSize != 0) {
    return InvalidArgument("pool geometry: block_bytes " + std::to_string(args.block_bytes) +
                           " is not a multiple of 2 MiB on a hugetlb pool");
  }
  if (!args.huge_pages && args.block_bytes % 4096 != 0) {
    return InvalidArgument("pool geometry: block_bytes " + std::to_string(args.block_bytes) +
                           " is not a multiple of the 4096-byte page");
  }
  const uint64_t pool_bytes = uint64_t{args.block_count} * args.block_bytes;
  if (args.reserve_bytes < pool_bytes) {
    return InvalidArgument("pool geometry: reserve_bytes " + std::to_string(args.reserve_bytes) +
                           " is smaller than the pool's " + std::to_string(pool_bytes));
  }
  if (fd_size < pool_bytes) {
    return InvalidArgument("pool fd holds " + std::to_string(fd_size) + " bytes, less than " +
                           std::to_string(args.block_count) + " blocks of " +
                           std::to_string(args.block_bytes));
  }
  return OkStatus();
}

}  // namespace

Result<PoolMapping> PoolMapping::Reserve(UniqueFd pool_fd, const PoolGeometryArgs& args) {
  struct stat st {};
  if (::fstat(pool_fd.get(), &st) != 0) return ErrnoStatus("fstat of the pool fd", errno);
  BATON_RETURN_IF_ERROR(CheckGeometry(args, static_cast<uint64_t>(st.st_size)));
  PoolMapping pool;
  pool.args_ = args;
  pool.reserved_ = RoundUp(args.reserve_bytes, kHugePageSize);
  pool.region_bytes_ = pool.reserved_ + kHugePageSize;
  void* region = ::mmap(nullptr, pool.region_bytes_, PROT_NONE, kReserveFlags, -1, 0);
  if (region == MAP_FAILED) {
    return ErrnoStatus("reserving " + std::to_string(pool.region_bytes_) + " bytes for the pool",
                       errno);
  }
  pool.region_ = static_cast<uint8_t*>(region);
  const auto addr = reinterpret_cast<uintptr_t>(region);
  const uintptr_t aligned = RoundUp(addr, kHugePageSize);
  pool.base_ = reinterpret_cast<uint8_t*>(aligned);
  pool.fd_ = std::move(pool_fd);
  return pool;
}

PoolMapping::~PoolMapping() { Release(); }

PoolMapping::PoolMapping(PoolMapping&& other) noexcept { *this = std::move(other); }

PoolMapping& PoolMapping::operator=(PoolMapping&& other) noexcept {
  if (this == &other) return *this;
  Release();
  fd_ = std::move(other.fd_);
  args_ = other.args_;
  region_ = std::exchange(other.region_, nullptr);
  region_bytes_ = std::exchange(other.region_bytes_, 0);
  base_ = std::exchange(other.base_, nullptr);
  reserved_ = std::exchange(other.reserved_, 0);
  mapped_ = std::move(other.mapped_);
  other.mapped_.clear();
  read_only_ = std::move(other.read_only_);
  other.read_only_.clear();
  header_view_ = std::exchange(other.header_view_, nullptr);
  header_view_bytes_ = std::exchange(other.header_view_bytes_, 0);
  return *this;
}

void PoolMapping::Release() {
  if (header_view_ != nullptr) ::munmap(header_view_, header_view_bytes_);
  header_view_ = nullptr;
  header_view_bytes_ = 0;
  if (region_ != nullptr) ::munmap(region_, region_bytes_);
  region_ = nullptr;
  base_ = nullptr;
  mapped_.clear();
  read_only_.clear();
  fd_.Reset();
}

Status PoolMapping::CheckRange(uint32_t first, uint32_t count) const {
  if (base_ == nullptr) return FailedPrecondition("the pool range is not reserved");
  if (count == 0 || uint64_t{first} + count > args_.block_count) {
    return InvalidArgument(BlockText(first, count) + " lie outside the pool of " +
                           std::to_string(args_.block_count) + " blocks");
  }
  return OkStatus();
}

Status PoolMapping::MapInPlace(uint32_t first, uint32_t count, int prot) {
  BATON_RETURN_IF_ERROR(CheckRange(first, count));
  for (uint32_t b = first; b < first + count; ++b) {
    if (IsMapped(b)) {
      return FailedPrecondition(BlockText(first, count) + " overlap block " + std::to_string(b) +
                                ", mapped writable");
    }
  }
  const uint64_t offset = uint64_t{first} * args_.block_bytes;
  const uint64_t bytes = uint64_t{count} * args_.block_bytes;
  void* got = ::mmap(base_ + offset, bytes, prot, MAP_SHARED | MAP_FIXED, fd_.get(),
                     static_cast<off_t>(offset));
  if (got == MAP_FAILED) {
    return ErrnoStatus(
        "mapping pool " + BlockText(first, count) + ((prot & PROT_WRITE) != 0 ? "" : " read-only"),
        errno);
  }
  return OkStatus();
}

Status PoolMapping::MapExtent(uint32_t first, uint32_t count) {
  BATON_RETURN_IF_ERROR(MapInPlace(first, count, PROT_READ | PROT_WRITE));
  read_only_.erase(read_only_.lower_bound(first), read_only_.lower_bound(first + count));
  mapped_[first] = count;
  // Coalesce with neighbours so that mapped() stays a list of maximal runs.
  auto it = mapped_.find(first);
  if (it != mapped_.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second == first) {
      prev->second += it->second;
      mapped_.erase(it);
      it = prev;
    }
  }
  auto next = std::next(it);
  if (next != mapped_.end() && it->first + it->second == next->first) {
    it->second += next->second;
    mapped_.erase(next);
  }
  return OkStatus();
}

Status PoolMapping::UnmapExtent(uint32_t first, uint32_t count) {
  BATON_RETURN_IF_ERROR(CheckRange(first, count));
  auto it = mapped_.upper_bound(first);
  if (it == mapped_.begin()) return FailedPrecondition(BlockText(first, count) + " are not mapped");
  --it;
  const uint32_t run_first = it->first;
  const uint32_t run_end = it->first + it->second;
  if (first + count > run_end) {
    return FailedPrecondition(BlockText(first, count) + " are not all mapped");
  }
  const uint64_t offset = uint64_t{first} * args_.block_bytes;
  const uint64_t bytes = uint64_t{count} * args_.block_bytes;
  void* got = ::mmap(base_ + offset, bytes, PROT_NONE, kReserveFlags | MAP_FIXED, -1, 0);
  if (got == MAP_FAILED) return ErrnoStatus("unmapping pool " + BlockText(first, count), errno);
  mapped_.erase(it);
  if (first > run_first) mapped_[run_first] = first - run_first;
  if (first + count < run_end) mapped_[first + count] = run_end - (first + count);
  return OkStatus();
}

Status PoolMapping::MapReadOnly(uint32_t first, uint32_t count) {
  BATON_RETURN_IF_ERROR(MapInPlace(first, count, PROT_READ));
  for (uint32_t b = first; b < first + count; ++b) read_only_.insert(b);
  return OkStatus();
}

void PoolMapping::UnmapReadOnly() {
  for (uint32_t b : read_only_) {
    (void)::mmap(BlockData(b), args_.block_bytes, PROT_NONE, kReserveFlags | MAP_FIXED, -1, 0);
  }
  read_only_.clear();
}

void PoolMapping::CopyHeaders(uint32_t first, uint32_t count, uint64_t header_bytes,
                              std::vector<uint8_t>* out) const {
  const uint64_t n = std::min(header_bytes, args_.block_bytes);
  for (uint32_t b = first; b < first + count; ++b) {
    const size_t at = out->size();
    out->resize(at + header_bytes, 0);
    if (IsMapped(b) || IsReadOnly(b)) std::memcpy(out->data() + at, BlockData(b), n);
  }
}

void PoolMapping::ScrubHeaders(uint32_t first, uint32_t count, uint64_t header_bytes) {
  const uint64_t n = std::min(header_bytes, args_.block_bytes);
  for (uint32_t b = first; b < first + count; ++b) {
    if (IsMapped(b)) std::memset(BlockData(b), 0, n);
  }
}

void PoolMapping::UnmapAll() {
  UnmapReadOnly();
  while (!mapped_.empty()) {
    auto [first, count] = *mapped_.begin();
    if (!UnmapExtent(first, count).ok()) {
      mapped_.erase(mapped_.begin());
    }
  }
}

Status PoolMapping::MapHeaderView() {
  if (base_ == nullptr) return FailedPrecondition("the pool range is not reserved");
  if (header_view_ != nullptr) return OkStatus();
  const int seals = ::fcntl(fd_.get(), F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    return FailedPrecondition("the pool's fd is not sealed against shrinking");
  }
  const uint64_t bytes = uint64_t{args_.block_count} * args_.block_bytes;
  void* view = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd_.get(), 0);
  if (view == MAP_FAILED) return ErrnoStatus("mapping the pool's header view", errno);
  (void)::madvise(view, bytes, MADV_DONTDUMP);  // a core dump would hold the whole pool
  header_view_ = static_cast<uint8_t*>(view);
  header_view_bytes_ = bytes;
  return OkStatus();
}

void PoolMapping::PrefaultHeaderView(uint32_t first, uint32_t count) const {
  if (header_view_ == nullptr || !CheckRange(first, count).ok()) return;
  for (uint32_t b = first; b < first + count; ++b) {
    (void)*static_cast<const volatile uint8_t*>(header_view_ + uint64_t{b} * args_.block_bytes);
  }
}

uint32_t PoolMapping::mapped_blocks() const {
  uint32_t n = 0;
  for (const auto& [first, count] : mapped_) n += count;
  return n;
}

bool PoolMapping::IsMapped(uint32_t block) const {
  auto it = mapped_.upper_bound(block);
  if (it == mapped_.begin()) return false;
  --it;
  return block < it->first + it->second;
}

}  // namespace baton
