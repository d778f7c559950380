#include "tests/cuda/fake_cuda_state.h"

#ifdef BATON_HAVE_CUDA_HEADERS

#include <unistd.h>

#include <cstdlib>
#include <iterator>

namespace baton::fake_cuda {
namespace {

// Whether [at, at + size) overlaps one of `ranges` (start -> a value; size_of gives its length).
template <typename Map, typename SizeOf>
bool Overlaps(const Map& ranges, uintptr_t at, size_t size, SizeOf size_of) {
  auto next = ranges.lower_bound(at);
  if (next != ranges.end() && next->first < at + size) return true;
  return next != ranges.begin() && std::prev(next)->first + size_of(std::prev(next)->second) > at;
}

// The range of `ranges` (start -> value) that starts at or before `at`, or end().
template <typename Map>
auto AtOrBefore(Map& ranges, uintptr_t at) {
  auto it = ranges.upper_bound(at);
  return it == ranges.begin() ? ranges.end() : std::prev(it);
}

}  // namespace

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
  auto r = AtOrBefore(reservations_, at);
  if (r == reservations_.end() || at + size > r->first + r->second) {
    return CUDA_ERROR_INVALID_VALUE;  // not inside one reservation
  }
  if (Overlaps(mappings_, at, size, [](const Mapping& m) { return m.size; })) {
    return CUDA_ERROR_INVALID_VALUE;  // mapped already
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
  return MappedLocked(at, size, host_numa);
}

bool State::MappedLocked(uintptr_t at, size_t size, bool host_numa) {
  auto it = AtOrBefore(mappings_, at);
  uintptr_t covered = at;
  while (it != mappings_.end() && it->first <= covered && covered < at + size) {
    if (it->first + it->second.size <= covered) return false;
    if (host_numa && !it->second.host_numa) return false;
    covered = it->first + it->second.size;
    ++it;
  }
  return covered >= at + size;
}

bool State::DeviceSideFits(uintptr_t at, size_t size) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!MappedLocked(at, size, false)) return false;
  for (auto it = AtOrBefore(mappings_, at); it != mappings_.end() && it->first < at + size; ++it) {
    if (it->second.host_numa) {
      return at >= it->first && at + size <= it->first + it->second.size;
    }
  }
  return true;
}

CUresult State::AddPinned(uintptr_t at, size_t size, bool allocated) {
  std::lock_guard<std::mutex> lock(mu_);
  if (Overlaps(pinned_, at, size, [](const PinnedHost& p) { return p.size; })) {
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
  if (auto it = AtOrBefore(pinned_, at); it != pinned_.end() && at < it->first + it->second.size) {
    return at + size <= it->first + it->second.size;
  }
  if (auto it = AtOrBefore(mappings_, at);
      it != mappings_.end() && at < it->first + it->second.size) {
    return it->second.host_numa && at + size <= it->first + it->second.size;
  }
  // Pageable: not running into pinned memory or a mapping.
  auto pinned = pinned_.lower_bound(at);
  auto mapped = mappings_.lower_bound(at);
  return (pinned == pinned_.end() || pinned->first >= at + size) &&
         (mapped == mappings_.end() || mapped->first >= at + size);
}

void State::ForgetPinned() {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [at, range] : pinned_) {
    if (range.allocated) std::free(reinterpret_cast<void*>(at));  // cuMemAllocHost's
  }
  pinned_.clear();
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
