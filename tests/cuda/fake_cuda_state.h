// FakeCudaState: what the fake driver's "vmm" mode (tests/cuda/fake_cuda_vmm.cc,
// tests/cuda/fake_cuda_host.cc) knows of the process's CUDA memory, so that it refuses what the
// real driver refuses for the calls Baton makes instead of doing whatever host memory allows:
//   reservations  cuMemAddressReserve ranges (cuMemMap only inside one, cuMemAddressFree of
//                 exactly one)
//   mappings      cuMemMap ranges (never over another; cuMemUnmap of whole mappings only;
//                 cuMemSetAccess and the device side of a copy only over mapped memory) with
//                 the kind of the allocation behind them
//   pinned host   cuMemHostRegister ranges and cuMemAllocHost buffers (no overlap; a copy
//                 whose host side starts inside one, or inside a host-NUMA mapping, must end
//                 inside it; a pageable one must not run into one), all gone with the
//                 primary context
// Every refusal is documented in docs/gpu.md ("What the emulated device refuses"). One
// process-wide instance (as a driver's state is per process); every member takes its mutex,
// so the driver's functions may be called from any thread.
#pragma once

#ifdef BATON_HAVE_CUDA_HEADERS

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>

namespace baton::fake_cuda {

constexpr size_t kGranularity = 2u << 20;

// A cuMemCreate allocation or an imported one: a memfd.
struct Allocation {
  int fd = -1;
  size_t size = 0;
  bool host_numa = false;   // CU_MEM_LOCATION_TYPE_HOST_NUMA
  bool exportable = false;  // POSIX_FILE_DESCRIPTOR was requested (or it was imported so)
};

struct Mapping {
  size_t size = 0;
  bool host_numa = false;
};

struct PinnedHost {
  size_t size = 0;
  bool allocated = false;  // cuMemAllocHost (else cuMemHostRegister)
};

class State {
 public:
  static State& Get();

  CUresult AddReservation(uintptr_t at, size_t size);
  CUresult RemoveReservation(uintptr_t at, size_t size);
  // [at, at + size) lies in one reservation and overlaps no mapping: record it.
  CUresult AddMapping(uintptr_t at, size_t size, bool host_numa);
  // [at, at + size) is a run of whole mappings: forget them.
  CUresult RemoveMappings(uintptr_t at, size_t size);
  // [at, at + size) is covered by mappings without a gap; with `host_numa`, all of them are
  // of host-NUMA allocations.
  bool Mapped(uintptr_t at, size_t size, bool host_numa = false);
  // The device side of a copy or memset: mapped, and when it touches host-NUMA memory, inside
  // one such mapping (one allocation per copy, as on the host side).
  bool DeviceSideFits(uintptr_t at, size_t size);

  CUresult AddPinned(uintptr_t at, size_t size, bool allocated);
  // Unregisters (`allocated` false) or frees the pinned range that starts at `at`.
  CUresult RemovePinned(uintptr_t at, bool allocated);
  // The host side of a copy: it may be pageable, but when it starts inside a pinned range or
  // a host-NUMA mapping it must end inside it too, and a pageable one must not run into
  // either (the driver takes one allocation or registration per copy).
  bool HostSideFits(uintptr_t at, size_t size);
  // The primary context is gone, and with it every pinned range (cuMemAllocHost's freed).
  void ForgetPinned();

 private:
  bool MappedLocked(uintptr_t at, size_t size, bool host_numa);

  std::mutex mu_;
  std::map<uintptr_t, size_t> reservations_;
  std::map<uintptr_t, Mapping> mappings_;
  std::map<uintptr_t, PinnedHost> pinned_;
};

// While the file named by $BATON_FAKE_CUDA_LOST exists the device is lost (as after an
// uncorrectable error, until a reset): copies, kernels, allocations and context retains fail.
bool DeviceLost();

// CUDA_SUCCESS when a live context is current on the calling thread; else
// CUDA_ERROR_INVALID_CONTEXT ("no context bound to the current thread", cuda.h) or, once the
// primary context's last retain was released, CUDA_ERROR_CONTEXT_IS_DESTROYED
// (tests/cuda/fake_cuda_context.cc).
CUresult NeedContext();

// `Fn` for a call that works in the current context: it fails as NeedContext() says first.
template <auto Fn>
struct InContext;
template <typename... Args, CUresult (*Fn)(Args...)>
struct InContext<Fn> {
  static CUresult Call(Args... args) {
    if (CUresult r = NeedContext(); r != CUDA_SUCCESS) return r;
    return Fn(args...);
  }
};

// Whether the emulated device lets cuMemHostRegister take CU_MEMHOSTREGISTER_READ_ONLY
// (CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED): yes unless
// $BATON_FAKE_CUDA_NO_READ_ONLY_REGISTER is set.
bool ReadOnlyRegisterSupported();

// A driver function this library implements, under the name cuGetProcAddress asks for.
struct Entry {
  const char* name;
  void* fn;
};
#define BATON_FAKE(name, fn) \
  { name, reinterpret_cast<void*>(&fn) }
// An entry that needs a current context (InContext).
#define BATON_FAKE_IN_CONTEXT(name, fn) \
  { name, reinterpret_cast<void*>(&::baton::fake_cuda::InContext<&fn>::Call) }
// The function of `entries` named `symbol`, or nullptr.
template <size_t N>
void* FindEntry(const Entry (&entries)[N], const char* symbol) {
  for (const Entry& e : entries) {
    if (std::strcmp(e.name, symbol) == 0) return e.fn;
  }
  return nullptr;
}

// The vmm mode's host-memory functions (fake_cuda_host.cc) by name, or nullptr.
void* HostFunction(const char* symbol);
void* ContextFunction(const char* symbol);

}  // namespace baton::fake_cuda

#endif  // BATON_HAVE_CUDA_HEADERS
