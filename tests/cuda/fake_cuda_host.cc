// The fake driver's "vmm" mode, host memory: page-locked host ranges (cuMemHostRegister,
// cuMemAllocHost) and the copies between them and the emulated device's memory
// (tests/cuda/fake_cuda_state.h says what is checked). Registering locks nothing: the
// emulated device reads host memory directly.
//
// cuMemHostRegister refuses what the real driver refuses for Baton's calls: a null pointer,
// size 0, flags it does not know, a range that is not wholly mapped and readable (read from
// /proc/self/maps), a range mapped read-only without CU_MEMHOSTREGISTER_READ_ONLY
// (CUDA_ERROR_INVALID_VALUE: on an x86 host, whose GPU does not use the host's page tables,
// the driver needs that flag for memory the CPU maps read-only), READ_ONLY where the device
// does not support it (CUDA_ERROR_NOT_SUPPORTED), and a range overlapping a registration or
// a cuMemAllocHost buffer (CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED). cuMemHostUnregister
// takes only the base of a registration (CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED). A copy's
// device side must be mapped and its host side must not start in a pinned range and run past
// its end (CUDA_ERROR_INVALID_VALUE).
#ifdef BATON_HAVE_CUDA_HEADERS

#include <cuda.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "tests/cuda/fake_cuda_state.h"

namespace baton::fake_cuda {
namespace {

constexpr unsigned kKnownRegisterFlags = CU_MEMHOSTREGISTER_PORTABLE |
                                         CU_MEMHOSTREGISTER_DEVICEMAP |
                                         CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY;

uintptr_t Address(const void* p) { return reinterpret_cast<uintptr_t>(p); }
void* At(CUdeviceptr p) { return reinterpret_cast<void*>(static_cast<uintptr_t>(p)); }

// What the process maps over [at, at + size): kNone where a byte is not mapped readable,
// kReadOnly where every byte is readable and some are not writable, else kReadWrite.
enum class HostAccess { kNone, kReadOnly, kReadWrite };
HostAccess AccessOf(uintptr_t at, size_t size) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  uintptr_t covered = at;
  bool writable = true;
  while (std::getline(maps, line) && covered < at + size) {
    unsigned long long start = 0, end = 0;
    char perms[8] = {};
    if (std::sscanf(line.c_str(), "%llx-%llx %7s", &start, &end, perms) != 3) continue;
    if (end <= covered) continue;
    if (start > covered) return HostAccess::kNone;  // a hole (the lines are in address order)
    if (perms[0] != 'r') return HostAccess::kNone;
    writable = writable && perms[1] == 'w';
    covered = end;
  }
  if (covered < at + size) return HostAccess::kNone;
  return writable ? HostAccess::kReadWrite : HostAccess::kReadOnly;
}

CUresult HostRegister(void* p, size_t size, unsigned flags) {
  if (p == nullptr || size == 0 || (flags & ~kKnownRegisterFlags) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if ((flags & CU_MEMHOSTREGISTER_IOMEMORY) != 0) return CUDA_ERROR_NOT_PERMITTED;  // no PCI BAR
  const bool read_only_flag = (flags & CU_MEMHOSTREGISTER_READ_ONLY) != 0;
  if (read_only_flag && !ReadOnlyRegisterSupported()) return CUDA_ERROR_NOT_SUPPORTED;
  switch (AccessOf(Address(p), size)) {
    case HostAccess::kNone:
      return CUDA_ERROR_INVALID_VALUE;
    case HostAccess::kReadOnly:
      if (!read_only_flag) return CUDA_ERROR_INVALID_VALUE;
      break;
    case HostAccess::kReadWrite:
      break;
  }
  return State::Get().AddPinned(Address(p), size, /*allocated=*/false);
}

CUresult HostUnregister(void* p) {
  return State::Get().RemovePinned(Address(p), /*allocated=*/false);
}

CUresult AllocHost(void** p, size_t n) {
  if (n == 0) return CUDA_ERROR_INVALID_VALUE;
  *p = std::malloc(n);
  if (*p == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  return State::Get().AddPinned(Address(*p), n, /*allocated=*/true);
}

CUresult FreeHost(void* p) {
  if (CUresult r = State::Get().RemovePinned(Address(p), /*allocated=*/true); r != CUDA_SUCCESS) {
    return r;
  }
  std::free(p);
  return CUDA_SUCCESS;
}

// A copy of n bytes between device address `device` and host address `host`.
CUresult CheckCopy(CUdeviceptr device, const void* host, size_t n) {
  if (DeviceLost()) return CUDA_ERROR_ECC_UNCORRECTABLE;
  if (n == 0) return CUDA_SUCCESS;
  if (!State::Get().DeviceSideFits(device, n)) return CUDA_ERROR_INVALID_VALUE;
  if (!State::Get().HostSideFits(Address(host), n)) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

CUresult HtoD(CUdeviceptr dst, const void* src, size_t n) {
  if (CUresult r = CheckCopy(dst, src, n); r != CUDA_SUCCESS || n == 0) return r;
  std::memcpy(At(dst), src, n);
  return CUDA_SUCCESS;
}
CUresult HtoDAsync(CUdeviceptr dst, const void* src, size_t n, CUstream) {
  return HtoD(dst, src, n);
}
CUresult DtoH(void* dst, CUdeviceptr src, size_t n) {
  if (CUresult r = CheckCopy(src, dst, n); r != CUDA_SUCCESS || n == 0) return r;
  std::memcpy(dst, At(src), n);
  return CUDA_SUCCESS;
}
CUresult DtoHAsync(void* dst, CUdeviceptr src, size_t n, CUstream) { return DtoH(dst, src, n); }
CUresult DtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream) {
  if (DeviceLost()) return CUDA_ERROR_ECC_UNCORRECTABLE;
  if (n == 0) return CUDA_SUCCESS;
  if (!State::Get().DeviceSideFits(dst, n) || !State::Get().DeviceSideFits(src, n)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::memmove(At(dst), At(src), n);
  return CUDA_SUCCESS;
}

CUresult MemsetD32Async(CUdeviceptr dst, unsigned value, size_t n, CUstream) {
  if (DeviceLost()) return CUDA_ERROR_ECC_UNCORRECTABLE;
  if (n == 0) return CUDA_SUCCESS;
  if (!State::Get().DeviceSideFits(dst, n * 4)) return CUDA_ERROR_INVALID_VALUE;
  auto* words = static_cast<uint32_t*>(At(dst));
  for (size_t i = 0; i < n; ++i) words[i] = value;
  return CUDA_SUCCESS;
}

const Entry kHostEntries[] = {
    BATON_FAKE_IN_CONTEXT("cuMemcpyHtoD", HtoD),
    BATON_FAKE_IN_CONTEXT("cuMemcpyHtoDAsync", HtoDAsync),
    BATON_FAKE_IN_CONTEXT("cuMemcpyDtoH", DtoH),
    BATON_FAKE_IN_CONTEXT("cuMemcpyDtoHAsync", DtoHAsync),
    BATON_FAKE_IN_CONTEXT("cuMemcpyDtoDAsync", DtoDAsync),
    BATON_FAKE_IN_CONTEXT("cuMemsetD32Async", MemsetD32Async),
    BATON_FAKE_IN_CONTEXT("cuMemHostRegister", HostRegister),
    BATON_FAKE_IN_CONTEXT("cuMemHostUnregister", HostUnregister),
    BATON_FAKE_IN_CONTEXT("cuMemAllocHost", AllocHost),
    BATON_FAKE_IN_CONTEXT("cuMemFreeHost", FreeHost),
};

}  // namespace

void* HostFunction(const char* symbol) { return FindEntry(kHostEntries, symbol); }

}  // namespace baton::fake_cuda

#endif  // BATON_HAVE_CUDA_HEADERS
