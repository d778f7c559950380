#include "standby/kernels/huge_buffer.h"

#include <sys/mman.h>

#include <cstdint>
#include <new>

#include "base/align.h"
#include "proto/transport/shared_memory.h"

namespace baton {
namespace {

constexpr std::align_val_t kSmallAlign{64};

size_t MappedBytes(size_t bytes) { return RoundUp(bytes, kHugePageSize); }

}  // namespace

void* AllocateHugeBuffer(size_t bytes) {
  if (bytes < kHugeBufferMinBytes) return ::operator new(bytes, kSmallAlign);
  const size_t size = MappedBytes(bytes);
  void* raw = ::mmap(nullptr, size + kHugePageSize, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = RoundUp(start, kHugePageSize);
  if (aligned > start) ::munmap(raw, aligned - start);
  const uintptr_t end = start + size + kHugePageSize;
  if (end > aligned + size) ::munmap(reinterpret_cast<void*>(aligned + size), end - aligned - size);
  void* p = reinterpret_cast<void*>(aligned);
  // Refused (EINVAL) by kernels built without THP; ignored where THP is "never": normal pages.
  (void)::madvise(p, size, MADV_HUGEPAGE);
  return p;
}

void FreeHugeBuffer(void* p, size_t bytes) {
  if (p == nullptr) return;
  if (bytes < kHugeBufferMinBytes) return ::operator delete(p, kSmallAlign);
  ::munmap(p, MappedBytes(bytes));
}

}  // namespace baton
