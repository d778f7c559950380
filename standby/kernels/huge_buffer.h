// HugePageAllocator: a std::allocator for the engine's large working buffers (the model's
// per-step activations), so that they sit in transparent huge pages.
//
// Blocks of kHugeBufferMinBytes or more get their own anonymous mapping, 2 MiB aligned and
// advised MADV_HUGEPAGE; smaller ones come from operator new. Two reasons: a decode or
// prefill step streams through these buffers (fewer TLB misses), and a killed engine's
// private memory is torn down before its death can be seen (pidfd, socket EOF): 16 MiB of
// 4 KiB pages took 1.5 ms to tear down on the 2-core VM, the same in 2 MiB pages 0.03 ms.
// Where THP is off the advice has no effect and the mapping keeps normal pages.
//
// Stateless and thread-safe; allocation failure throws std::bad_alloc.
#pragma once

#include <cstddef>
#include <vector>

namespace baton {

inline constexpr size_t kHugeBufferMinBytes = size_t{256} << 10;

void* AllocateHugeBuffer(size_t bytes);
void FreeHugeBuffer(void* p, size_t bytes);

template <typename T>
struct HugePageAllocator {
  using value_type = T;
  HugePageAllocator() = default;
  template <typename U>
  HugePageAllocator(const HugePageAllocator<U>&) {}  // NOLINT: allocator rebinding
  T* allocate(size_t n) { return static_cast<T*>(AllocateHugeBuffer(n * sizeof(T))); }
  void deallocate(T* p, size_t n) { FreeHugeBuffer(p, n * sizeof(T)); }
  template <typename U>
  bool operator==(const HugePageAllocator<U>&) const {
    return true;
  }
};

template <typename T>
using HugeVector = std::vector<T, HugePageAllocator<T>>;

}  // namespace baton
