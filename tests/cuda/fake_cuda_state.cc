#include "tests/cuda/fake_cuda_state.h"

#ifdef BATON_HAVE_CUDA_HEADERS

#include <unistd.h>

#include <cstdlib>

namespace baton::fake_cuda {

State& State::Get() {
  static State* state = new State();  // never destroyed: driver calls may outlive main()
  return *state;
}

CUresult State::AddReservation(uintptr_t at, size_t size) {
  std::lock_guard<std::mutex> lock(mu_);
  reservations_.emplace(at, size);
  return CUDA_SUCCESS;
}

CUresult State::RemoveReservation(uintptr_t at, size_t size) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = reservations_.find(at);
  if (it == reservations_.end() || it->second != size) return CUDA_ERROR_INVALID_VALUE;
  // A reservation with mappings left in it is not freed.
  auto m = mappings_.lower_bound(at);
  if (m != mappings_.end() && m->first < at + size) return CUDA_ERROR_INVALID_VALUE;
  reservations_.erase(it);
  return CUDA_SUCCESS;
}

CUresult State::AddMapping(uintptr_t at, size_t size, bool host_numa) {
  std::lock_guard<std::mutex> lock(mu_);
  auto r = reservations_.upper_bound(at);
  if (r == reservations_.begin()) return CUDA_ERROR_INVALID_VALUE;
  --r;
  if (at + size > r->first + r->second) return CUDA_ERROR_INVALID_VALUE;  // not inside one
  auto next = mappings_.lower_bound(at);
  if (next != mappings_.end() && next->first < at + size) return CUDA_ERROR_INVALID_VALUE;
  if (next != mappings_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second.size > at) return CUDA_ERROR_INVALID_VALUE;  // mapped already
  }
  mappings_.emplace(at, Mapping{size, host_numa});
  return CUDA_SUCCESS;
}

CUresult State::RemoveMappings(uintptr_t at, size_t size) {
  std::lock_guard<std::mutex> lock(mu_);
  auto first = mappings_.find(at);
  if (first == mappings_.end()) return CUDA_ERROR_INVALID_VALUE;
  auto it = first;
  uintptr_t end = at;
  while (end < at + size && it != mappings_.end() && it->first == end) {
    end += it->second.size;
    ++it;
  }
  if (end != at + size) return CUDA_ERROR_INVALID_VALUE;  // a gap, or a mapping cut in two
  mappings_.erase(first, it);
  return CUDA_SUCCESS;
}

bool State::Mapped(uintptr_t at, size_t size, bool host_numa) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = mappings_.upper_bound(at);
  if (it == mappings_.begin()) return false;
  --it;
  uintptr_t covered = at;
  while (it != mappings_.end() && it->first <= covered && covered < at + size) {
    if (it->first + it->second.size <= covered) return false;
    if (host_numa && !it->second.host_numa) return false;
    covered = it->first + it->second.size;
    ++it;
  }
  return covered >= at + size;
}

CUresult State::AddPinned(uintptr_t at, size_t size, bool allocated) {
  std::lock_guard<std::mutex> lock(mu_);
  auto next = pinned_.lower_bound(at);
  if (next != pinned_.end() && next->first < at + size) {
    return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  }
  if (next != pinned_.begin() && std::prev(next)->first + std::prev(next)->second.size > at) {
    return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  }
  pinned_.emplace(at, PinnedHost{size, allocated});
  return CUDA_SUCCESS;
}

CUresult State::RemovePinned(uintptr_t at, bool allocated) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pinned_.find(at);
  if (it == pinned_.end() || it->second.allocated != allocated) {
    return allocated ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
  }
  pinned_.erase(it);
  return CUDA_SUCCESS;
}

bool State::HostSideFits(uintptr_t at, size_t size) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pinned_.upper_bound(at);
  if (it == pinned_.begin()) return true;
  --it;
  const uintptr_t end = it->first + it->second.size;
  if (at >= end) return true;  // pageable
  return at + size <= end;
}

bool DeviceLost() {
  const char* path = std::getenv("BATON_FAKE_CUDA_LOST");
  return path != nullptr && ::access(path, F_OK) == 0;
}

bool ReadOnlyRegisterSupported() {
  return std::getenv("BATON_FAKE_CUDA_NO_READ_ONLY_REGISTER") == nullptr;
}

}  // namespace baton::fake_cuda

#endif  // BATON_HAVE_CUDA_HEADERS
