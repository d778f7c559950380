#include "proto/transport/shared_memory.h"

#include <fcntl.h>
#include <linux/memfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <utility>

#include "base/align.h"

namespace baton {

Mapping::~Mapping() { Reset(); }

Mapping::Mapping(Mapping&& other) noexcept
    : addr_(std::exchange(other.addr_, nullptr)), size_(std::exchange(other.size_, 0)) {}

Mapping& Mapping::operator=(Mapping&& other) noexcept {
  if (this != &other) {
    Reset();
    addr_ = std::exchange(other.addr_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void Mapping::Reset() {
  if (addr_ != nullptr) ::munmap(addr_, size_);
  addr_ = nullptr;
  size_ = 0;
}

namespace {

Result<UniqueFd> CreateMemfd(const std::string& name, unsigned flags) {
  int fd = ::memfd_create(name.c_str(), flags);
  if (fd < 0 && errno == EINVAL && (flags & MFD_HUGETLB) != 0) {
    // Kernels before 4.16 cannot seal hugetlb memfds: huge pages matter more than seals.
    fd = ::memfd_create(name.c_str(), flags & ~MFD_ALLOW_SEALING);
  }
  if (fd < 0) return ErrnoStatus("memfd_create(" + name + ")", errno);
  return UniqueFd(fd);
}

// A free address range of `size` bytes on an `align` boundary (found by mapping a larger
// range and releasing it), or nullptr.
void* FindAligned(size_t size, size_t align) {
  void* raw =
      ::mmap(nullptr, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  ::munmap(raw, size + align);
  return reinterpret_cast<void*>(RoundUp(reinterpret_cast<uintptr_t>(raw), align));
}

// Sizes a hugetlb memfd and reserves its pages. ftruncate takes no pages: a shared hugetlb
// mapping reserves them when it is made, and the reservation stays with the file after
// munmap (until the file is gone). One mapping made here therefore turns "too few free huge
// pages" into this error, where otherwise every later Map of the object would fail (ENOMEM).
Status ReserveHugePages(int fd, size_t size) {
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0) {
    return ErrnoStatus("ftruncate of hugetlb memfd", errno);
  }
  void* probe = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  if (probe == MAP_FAILED) {
    return ErrnoStatus("cannot reserve " + std::to_string(size / kHugePageSize) +
                           " huge pages of 2 MiB (raise vm.nr_hugepages)",
                       errno);
  }
  ::munmap(probe, size);
  return OkStatus();
}

}  // namespace

Result<SharedMemory> SharedMemory::Create(const SharedMemoryOptions& options) {
  if (options.size == 0) return InvalidArgument("shared memory '" + options.name + "': size 0");
  SharedMemory shm;
  if (options.try_huge_pages) {
    const size_t size = RoundUp(options.size, kHugePageSize);
    auto fd =
        CreateMemfd(options.name, MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_HUGETLB | MFD_HUGE_2MB);
    Status reserved = fd.ok() ? ReserveHugePages(fd->get(), size) : fd.status();
    if (reserved.ok()) {
      shm.fd_ = std::move(fd).value();
      shm.size_ = size;
      shm.huge_pages_ = true;
      return shm;
    }
    shm.fallback_reason_ = reserved.message();
  }
  BATON_ASSIGN_OR_RETURN(UniqueFd fd, CreateMemfd(options.name, MFD_CLOEXEC | MFD_ALLOW_SEALING));
  const size_t size = RoundUp(options.size, static_cast<size_t>(::sysconf(_SC_PAGESIZE)));
  if (::ftruncate(fd.get(), static_cast<off_t>(size)) != 0) {
    return ErrnoStatus("ftruncate memfd '" + options.name + "'", errno);
  }
  shm.fd_ = std::move(fd);
  shm.size_ = size;
  return shm;
}

Result<SharedMemory> SharedMemory::Import(UniqueFd fd) {
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus("fstat of imported memory fd", errno);
  if (st.st_size <= 0) return InvalidArgument("imported memory fd has size 0");
  SharedMemory shm;
  shm.size_ = static_cast<size_t>(st.st_size);
  // A hugetlb memfd reports its huge page size as the block size.
  shm.huge_pages_ = st.st_blksize >= static_cast<blksize_t>(kHugePageSize);
  shm.fd_ = std::move(fd);
  return shm;
}

Result<Mapping> SharedMemory::Map(Protection prot, bool populate) const {
  const int mprot = prot == Protection::kReadOnly ? PROT_READ : PROT_READ | PROT_WRITE;
  const int flags = MAP_SHARED | (populate ? MAP_POPULATE : 0);
  if (huge_pages_ && size_ >= kPageTableShareSize) {
    // MAP_FIXED_NOREPLACE: should another thread map into the range first, this fails and
    // the memory is mapped wherever the kernel likes, unshared but correct.
    if (void* hint = FindAligned(size_, kPageTableShareSize); hint != nullptr) {
      void* addr = ::mmap(hint, size_, mprot, flags | MAP_FIXED_NOREPLACE, fd_.get(), 0);
      if (addr == hint) return Mapping(addr, size_);
      if (addr != MAP_FAILED) ::munmap(addr, size_);  // a kernel that took it as a hint
    }
  }
  void* addr = ::mmap(nullptr, size_, mprot, flags, fd_.get(), 0);
  if (addr == MAP_FAILED) return ErrnoStatus("mmap of shared memory", errno);
  return Mapping(addr, size_);
}

Result<Mapping> MapBackToBack(const SharedMemory& first, const SharedMemory& second,
                              Protection prot, bool populate) {
  if (second.size() == 0) return first.Map(prot, populate);
  const size_t total = first.size() + second.size();
  const size_t align = first.huge_pages() && first.size() >= kPageTableShareSize
                           ? kPageTableShareSize
                           : kHugePageSize;
  void* raw =
      ::mmap(nullptr, total + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return ErrnoStatus("reserving the address range of two memfds", errno);
  const uintptr_t lo = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t start = RoundUp(lo, align);
  if (start > lo) ::munmap(raw, start - lo);
  if (const uintptr_t slack = lo + total + align - (start + total); slack > 0) {
    ::munmap(reinterpret_cast<void*>(start + total), slack);
  }
  Mapping range(reinterpret_cast<void*>(start), total);  // unmaps both parts, or the reservation
  const int mprot = prot == Protection::kReadOnly ? PROT_READ : PROT_READ | PROT_WRITE;
  const int flags = MAP_SHARED | MAP_FIXED | (populate ? MAP_POPULATE : 0);
  size_t offset = 0;
  for (const SharedMemory* part : {&first, &second}) {
    void* at = range.data() + offset;
    if (::mmap(at, part->size(), mprot, flags, part->fd(), 0) == MAP_FAILED) {
      return ErrnoStatus("mmap of part " + std::string(part == &first ? "1" : "2") +
                             " of shared memory at offset " + std::to_string(offset),
                         errno);
    }
    offset += part->size();
  }
  return range;
}

Result<UniqueFd> SharedMemory::Dup() const {
  int fd = ::fcntl(fd_.get(), F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return ErrnoStatus("dup of shared memory fd", errno);
  return UniqueFd(fd);
}

Status SharedMemory::Seal(Sealing sealing) {
  unsigned seals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
  if (sealing == Sealing::kReadOnly) seals |= F_SEAL_FUTURE_WRITE;
  if (::fcntl(fd_.get(), F_ADD_SEALS, seals) != 0) return ErrnoStatus("sealing memfd", errno);
  return OkStatus();
}

Result<unsigned> SharedMemory::seals() const {
  const int seals = ::fcntl(fd_.get(), F_GET_SEALS);
  if (seals < 0) return ErrnoStatus("F_GET_SEALS", errno);
  return static_cast<unsigned>(seals);
}

}  // namespace baton
