// SharedMemory and Mapping: memory that crosses process boundaries as a file descriptor.
//
// SharedMemory owns a memfd (2 MiB hugetlb pages when asked and available, normal pages
// otherwise; which one is reported by huge_pages()). The fd travels to another process over
// a proto::Channel (SCM_RIGHTS); the receiver wraps it with Import() and maps it. Mapping
// owns one mmap'd range and unmaps it on destruction. Both are move-only. Sizes of hugetlb
// memfds are rounded up to the huge page size. Objects are created sealable; the owner seals
// them once set up (Seal) so that a peer cannot resize them, or write to read-only ones.
// Thread-compatible.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "base/io/unique_fd.h"
#include "base/status.h"

namespace baton {

inline constexpr size_t kHugePageSize = 2u << 20;
// What one page-table page of 2 MiB entries covers on x86-64 (a PUD entry).
inline constexpr size_t kPageTableShareSize = size_t{1} << 30;

enum class Protection { kReadOnly, kReadWrite };

// Seals (memfd_create(2), fcntl F_ADD_SEALS) fixed on an object once it is set up. Both
// forbid resizing (a peer's ftruncate would otherwise take pages from under every other
// mapper, which then dies of SIGBUS) and adding further seals. kReadOnly also forbids every
// later write: write(2), fallocate holes, and any new writable mapping (F_SEAL_FUTURE_WRITE).
// Mappings that already exist keep their protection.
enum class Sealing { kFixedSize, kReadOnly };

class Mapping {
 public:
  Mapping() = default;
  Mapping(void* addr, size_t size) : addr_(addr), size_(size) {}
  ~Mapping();
  Mapping(Mapping&& other) noexcept;
  Mapping& operator=(Mapping&& other) noexcept;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;

  uint8_t* data() const { return static_cast<uint8_t*>(addr_); }
  size_t size() const { return size_; }
  bool valid() const { return addr_ != nullptr; }

 private:
  void Reset();
  void* addr_ = nullptr;
  size_t size_ = 0;
};

struct SharedMemoryOptions {
  std::string name = "baton";
  size_t size = 0;
  bool try_huge_pages = true;  // MFD_HUGETLB|MFD_HUGE_2MB, falling back to normal pages
};

class SharedMemory {
 public:
  // Creates a memfd of at least options.size bytes. Huge pages count as had only once the
  // object's pages are reserved, so that a later Map cannot fail for want of them; when they
  // were asked for but could not be had (no hugetlb support, too few free huge pages),
  // fallback_reason() says why.
  static Result<SharedMemory> Create(const SharedMemoryOptions& options);
  // Takes ownership of a memfd received from another process; the size comes from fstat.
  static Result<SharedMemory> Import(UniqueFd fd);

  // Maps the whole object MAP_SHARED. `populate` pre-faults it (MAP_POPULATE). A hugetlb
  // object of kPageTableShareSize or more is mapped at an address aligned to it: the kernel
  // then shares the page-table pages of each whole GiB among the processes that map the
  // same memory with the same protection, so the second mapper faults it in per GiB and an
  // exiting (or killed) mapper is torn down per GiB instead of per 2 MiB page.
  Result<Mapping> Map(Protection prot, bool populate = false) const;
  // A new fd for the same memory, for sending to another process.
  Result<UniqueFd> Dup() const;
  // Applies `sealing` (F_SEAL_SEAL included, so it is final). Fails on an object that is
  // already sealed or was not created sealable (an imported fd from an older controller).
  Status Seal(Sealing sealing);
  // The seals set on the object (F_GET_SEALS bits).
  Result<unsigned> seals() const;

  int fd() const { return fd_.get(); }
  size_t size() const { return size_; }
  bool huge_pages() const { return huge_pages_; }
  const std::string& fallback_reason() const { return fallback_reason_; }

 private:
  UniqueFd fd_;
  size_t size_ = 0;
  bool huge_pages_ = false;
  std::string fallback_reason_;
};

// Maps `first` and then `second` back to back, MAP_SHARED, in one range of first.size() +
// second.size() bytes, so that an offset means the same byte in every process that maps the
// two this way: a weight arena whose first part is on 2 MiB huge pages and the rest on 4 KiB
// pages. The range is reserved PROT_NONE first and each part placed in it with MAP_FIXED,
// so nothing else can land between them; it starts on a 2 MiB boundary (a GiB one when
// `first` is hugetlb and at least kPageTableShareSize, as Map() does). The returned Mapping
// unmaps both. `populate` pre-faults (MAP_POPULATE).
Result<Mapping> MapBackToBack(const SharedMemory& first, const SharedMemory& second,
                              Protection prot, bool populate = false);

}  // namespace baton
