// The fake driver's "vmm" mode (BATON_FAKE_CUDA=vmm): one device whose memory is host memory,
// so the CUDA backend's paths between real processes run on a machine without a GPU.
//
// A cuMemCreate allocation is a memfd; its POSIX-fd export is a dup of it; cuMemAddressReserve
// is a PROT_NONE mapping; cuMemMap maps the memfd there (MAP_SHARED, so every process that
// imported the fd sees the same bytes) and cuMemSetAccess sets the protection (READ or
// READ|WRITE), so a write through a read-only mapping faults as it would on the GPU. Copies
// and memsets are memcpy and loops; events complete at once; the kernels of
// cuda/kernels/kernels_ptx.h run on the host by name, baton_spin on a host thread of its stream
// (joined by cuStreamSynchronize) so that it runs on while the process goes on.
// It is a test double for the protocol and the bookkeeping, not a model of the GPU's timing,
// and it refuses what the real driver refuses for the calls Baton makes (fake_cuda_state.h;
// docs/gpu.md lists each refusal): cuMemCreate of a size that is not a multiple of the
// granularity or with properties the device does not have, an export of an allocation made
// without POSIX_FILE_DESCRIPTOR requested, an import of an fd that is not one of its exports,
// a reservation of a size that is not a multiple of the page, cuMemMap outside one reservation,
// over a mapping or not granularity-aligned, cuMemUnmap of part of a mapping, cuMemSetAccess
// over memory that is not mapped, and a reservation freed with mappings in it. Host memory
// (registrations, pinned buffers and copies) is in fake_cuda_host.cc.
#ifdef BATON_HAVE_CUDA_HEADERS

#include <cuda.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cuda/kernels/kernels_ptx.h"
#include "tests/cuda/fake_cuda_state.h"

namespace {

namespace fake_cuda = baton::fake_cuda;
using fake_cuda::Allocation;
using fake_cuda::DeviceLost;
using fake_cuda::Entry;
using fake_cuda::kGranularity;
using fake_cuda::State;

struct FakeEvent {
  std::chrono::steady_clock::time_point at;
};
struct FakeFunction {
  std::string name;
};

// While the file named by $BATON_FAKE_CUDA_HUNG exists the device accepts work but never
// finishes it: every stream reports CUDA_ERROR_NOT_READY.
bool Hung() {
  const char* path = std::getenv("BATON_FAKE_CUDA_HUNG");
  return path != nullptr && ::access(path, F_OK) == 0;
}

CUmemGenericAllocationHandle HandleOf(Allocation* a) {
  return static_cast<CUmemGenericAllocationHandle>(reinterpret_cast<uintptr_t>(a));
}
Allocation* AllocationOf(CUmemGenericAllocationHandle h) {
  return reinterpret_cast<Allocation*>(static_cast<uintptr_t>(h));
}
void* At(CUdeviceptr p) { return reinterpret_cast<void*>(static_cast<uintptr_t>(p)); }
bool Multiple(size_t n, size_t unit) { return n % unit == 0; }

CUresult DeviceGet(CUdevice* d, int ordinal) {
  if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
  *d = 0;
  return CUDA_SUCCESS;
}
CUresult DeviceGetCount(int* n) {
  *n = 1;
  return CUDA_SUCCESS;
}
CUresult DeviceGetName(char* name, int len, CUdevice) {
  std::snprintf(name, static_cast<size_t>(len), "%s", "Baton fake VMM device");
  return CUDA_SUCCESS;
}
// $BATON_FAKE_CUDA_HOST_NUMA set: the device has host-NUMA VMM allocations (node 0), which
// are memfd chunks like the device's.
bool HostNuma() { return std::getenv("BATON_FAKE_CUDA_HOST_NUMA") != nullptr; }
CUresult DeviceGetAttribute(int* v, CUdevice_attribute attr, CUdevice) {
  switch (attr) {
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
      *v = 1;
      return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
      *v = HostNuma() ? 1 : 0;
      return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID:
      *v = HostNuma() ? 0 : -1;
      return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED:
      *v = fake_cuda::ReadOnlyRegisterSupported() ? 1 : 0;
      return CUDA_SUCCESS;
    default:
      // compute mode default, no pageable access through the host's page tables (an x86
      // host: read-only host memory needs CU_MEMHOSTREGISTER_READ_ONLY), ...
      *v = 0;
      return CUDA_SUCCESS;
  }
}
CUresult DeviceTotalMem(size_t* bytes, CUdevice) {
  *bytes = size_t{64} << 30;
  return CUDA_SUCCESS;
}
CUresult DeviceGetPCIBusId(char* id, int len, CUdevice) {
  std::snprintf(id, static_cast<size_t>(len), "%s", "0000:00:00.0");
  return CUDA_SUCCESS;
}
CUresult Succeed() { return CUDA_SUCCESS; }
CUresult MemGetInfo(size_t* free, size_t* total) {
  *total = size_t{64} << 30;
  *free = *total;
  return CUDA_SUCCESS;
}
// The allocation properties cuMemCreate takes: pinned memory on device 0, or on host NUMA node
// 0 where the device has host-NUMA VMM; handle types POSIX_FD or none (none for plain HOST).
bool ValidProp(const CUmemAllocationProp* prop) {
  if (prop == nullptr || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED) return false;
  if ((prop->requestedHandleTypes & ~CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0) return false;
  switch (prop->location.type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
      return prop->location.id == 0;
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
      return HostNuma() && prop->location.id == 0;
    default:
      return false;
  }
}
CUresult Granularity(size_t* g, const CUmemAllocationProp* prop,
                     CUmemAllocationGranularity_flags option) {
  if (!ValidProp(prop) || (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
                           option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *g = kGranularity;
  return CUDA_SUCCESS;
}
// The memfd's name says what the allocation is, so that an import in another process knows.
constexpr char kDeviceMemfd[] = "fake-vmm-device";
constexpr char kHostNumaMemfd[] = "fake-vmm-host-numa";
CUresult MemCreate(CUmemGenericAllocationHandle* h, size_t size, const CUmemAllocationProp* prop,
                   unsigned long long flags) {
  if (DeviceLost()) return CUDA_ERROR_ECC_UNCORRECTABLE;
  if (!ValidProp(prop) || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (size == 0 || !Multiple(size, kGranularity)) return CUDA_ERROR_INVALID_VALUE;
  const bool host_numa = prop->location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA;
  const int fd = ::memfd_create(host_numa ? kHostNumaMemfd : kDeviceMemfd, MFD_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0) {
    ::close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  const bool exportable = prop->requestedHandleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  *h = HandleOf(new Allocation{fd, size, host_numa, exportable});
  return CUDA_SUCCESS;
}
CUresult MemRelease(CUmemGenericAllocationHandle h) {
  if (h == 0) return CUDA_ERROR_INVALID_VALUE;
  Allocation* a = AllocationOf(h);
  ::close(a->fd);
  delete a;
  return CUDA_SUCCESS;
}
// Only an allocation made with POSIX_FILE_DESCRIPTOR requested (or imported from one) exports
// one.
CUresult MemExport(void* out, CUmemGenericAllocationHandle h, CUmemAllocationHandleType type,
                   unsigned long long flags) {
  if (h == 0 || out == nullptr || flags != 0 || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR ||
      !AllocationOf(h)->exportable) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const int fd = ::fcntl(AllocationOf(h)->fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  *static_cast<int*>(out) = fd;
  return CUDA_SUCCESS;
}
// What the fd is: one of this driver's exports (a memfd it named), and which kind.
bool ExportedMemfd(int fd, bool* host_numa) {
  char link[256] = {};
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  const ssize_t n = ::readlink(path.c_str(), link, sizeof(link) - 1);
  if (n <= 0) return false;
  const std::string name(link, static_cast<size_t>(n));
  *host_numa = name.rfind(std::string("/memfd:") + kHostNumaMemfd, 0) == 0;
  return *host_numa || name.rfind(std::string("/memfd:") + kDeviceMemfd, 0) == 0;
}
CUresult MemImport(CUmemGenericAllocationHandle* h, void* os_handle,
                   CUmemAllocationHandleType type) {
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_INVALID_VALUE;
  const int given = static_cast<int>(reinterpret_cast<uintptr_t>(os_handle));
  struct stat st;
  bool host_numa = false;
  if (::fstat(given, &st) != 0 || !ExportedMemfd(given, &host_numa)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const int fd = ::fcntl(given, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  *h = HandleOf(new Allocation{fd, static_cast<size_t>(st.st_size), host_numa, true});
  return CUDA_SUCCESS;
}
// Size a multiple of the host page, alignment a power of two or 0, flags 0; the address is a
// hint, which this driver ignores.
CUresult AddressReserve(CUdeviceptr* p, size_t size, size_t alignment, CUdeviceptr,
                        unsigned long long flags) {
  const size_t page = static_cast<size_t>(::getpagesize());
  if (size == 0 || !Multiple(size, page) || flags != 0 || (alignment & (alignment - 1)) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const size_t align = std::max(alignment == 0 ? kGranularity : alignment, page);
  void* raw =
      ::mmap(nullptr, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + align - 1) / align * align;
  if (aligned > start) ::munmap(raw, aligned - start);
  if (start + align > aligned) ::munmap(At(aligned + size), start + align - aligned);
  *p = aligned;
  return State::Get().AddReservation(aligned, size);
}
// Exactly a reservation, with nothing mapped in it any more.
CUresult AddressFree(CUdeviceptr p, size_t size) {
  if (CUresult r = State::Get().RemoveReservation(p, size); r != CUDA_SUCCESS) return r;
  return ::munmap(At(p), size) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
// Address, size (and offset, which must be 0) multiples of the granularity, the size within the
// allocation, the range inside one reservation and not mapped yet, flags 0.
CUresult MemMap(CUdeviceptr p, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                unsigned long long flags) {
  if (h == 0 || offset != 0 || flags != 0 || size == 0 || size > AllocationOf(h)->size ||
      !Multiple(p, kGranularity) || !Multiple(size, kGranularity)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (CUresult r = State::Get().AddMapping(p, size, AllocationOf(h)->host_numa);
      r != CUDA_SUCCESS) {
    return r;
  }
  void* m = ::mmap(At(p), size, PROT_NONE, MAP_SHARED | MAP_FIXED, AllocationOf(h)->fd, 0);
  if (m != MAP_FAILED) return CUDA_SUCCESS;
  (void)State::Get().RemoveMappings(p, size);
  return CUDA_ERROR_OUT_OF_MEMORY;
}
// Whole mappings only (a run of them), never a part of one.
CUresult MemUnmap(CUdeviceptr p, size_t size) {
  if (CUresult r = State::Get().RemoveMappings(p, size); r != CUDA_SUCCESS) return r;
  void* m = ::mmap(At(p), size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE,
                   -1, 0);
  return m == MAP_FAILED ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}
// A fully mapped range; locations the device (0) or, for host-NUMA allocations only, a host
// NUMA node; flags none, READ or READWRITE. The last descriptor decides the CPU-visible
// protection here. $BATON_FAKE_CUDA_NO_READ_ONLY set: read-only access is refused, as a
// driver may.
CUresult MemSetAccess(CUdeviceptr p, size_t size, const CUmemAccessDesc* desc, size_t count) {
  if (count == 0 || desc == nullptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < count; ++i) {
    const CUmemLocation& where = desc[i].location;
    const bool device = where.type == CU_MEM_LOCATION_TYPE_DEVICE && where.id == 0;
    const bool numa = where.type == CU_MEM_LOCATION_TYPE_HOST_NUMA;
    if (!device && !numa) return CUDA_ERROR_INVALID_DEVICE;
    if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE &&
        desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
        desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (!State::Get().Mapped(p, size, /*host_numa=*/numa)) return CUDA_ERROR_INVALID_VALUE;
    if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READ &&
        std::getenv("BATON_FAKE_CUDA_NO_READ_ONLY") != nullptr) {
      return CUDA_ERROR_NOT_SUPPORTED;
    }
  }
  const CUmemAccess_flags flags = desc[count - 1].flags;
  const int prot = flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? PROT_READ | PROT_WRITE
                   : flags == CU_MEM_ACCESS_FLAGS_PROT_READ    ? PROT_READ
                                                               : PROT_NONE;
  return ::mprotect(At(p), size, prot) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
// A stream runs its long kernels (baton_spin) on host threads, as a GPU runs them while the
// process goes on; synchronizing joins them. A process killed meanwhile takes them along,
// as a killed process takes its GPU context.
struct FakeStream {
  std::mutex mu;
  std::vector<std::thread> running;
  std::shared_ptr<std::atomic<int>> left = std::make_shared<std::atomic<int>>(0);
};
FakeStream* StreamOf(CUstream s) { return reinterpret_cast<FakeStream*>(s); }
CUresult StreamCreate(CUstream* s, unsigned) {
  *s = reinterpret_cast<CUstream>(new FakeStream());
  return CUDA_SUCCESS;
}
CUresult StreamSynchronize(CUstream s) {
  if (s == nullptr) return CUDA_SUCCESS;
  std::vector<std::thread> running;
  {
    std::lock_guard<std::mutex> lock(StreamOf(s)->mu);
    running.swap(StreamOf(s)->running);
  }
  for (std::thread& t : running) t.join();
  return CUDA_SUCCESS;
}
CUresult StreamQuery(CUstream s) {
  if (Hung()) return CUDA_ERROR_NOT_READY;
  if (s == nullptr) return CUDA_SUCCESS;
  if (StreamOf(s)->left->load() > 0) return CUDA_ERROR_NOT_READY;
  return StreamSynchronize(s);  // all finished: join them
}
CUresult StreamDestroy(CUstream s) {
  StreamSynchronize(s);
  delete StreamOf(s);
  return CUDA_SUCCESS;
}
CUresult EventCreate(CUevent* e, unsigned) {
  *e = reinterpret_cast<CUevent>(new FakeEvent{std::chrono::steady_clock::now()});
  return CUDA_SUCCESS;
}
CUresult EventDestroy(CUevent e) {
  delete reinterpret_cast<FakeEvent*>(e);
  return CUDA_SUCCESS;
}
CUresult EventRecord(CUevent e, CUstream) {
  reinterpret_cast<FakeEvent*>(e)->at = std::chrono::steady_clock::now();
  return CUDA_SUCCESS;
}
CUresult EventElapsed(float* ms, CUevent start, CUevent end) {
  *ms = std::chrono::duration<float, std::milli>(reinterpret_cast<FakeEvent*>(end)->at -
                                                 reinterpret_cast<FakeEvent*>(start)->at)
            .count();
  return CUDA_SUCCESS;
}
// A module is the PTX it was loaded from; cuModuleGetFunction finds only its entries.
CUresult ModuleLoad(CUmodule* m, const void* image, unsigned, CUjit_option*, void**) {
  if (image == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *m = reinterpret_cast<CUmodule>(new std::string(static_cast<const char*>(image)));
  return CUDA_SUCCESS;
}
CUresult ModuleUnload(CUmodule m) {
  if (m == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  delete reinterpret_cast<std::string*>(m);
  return CUDA_SUCCESS;
}
CUresult ModuleGetFunction(CUfunction* f, CUmodule m, const char* name) {
  if (m == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const std::string& ptx = *reinterpret_cast<std::string*>(m);
  if (ptx.find(".entry " + std::string(name) + "(") == std::string::npos) {
    return CUDA_ERROR_NOT_FOUND;
  }
  // One handle per kernel name for the life of the process.
  static std::mutex mu;
  static std::map<std::string, FakeFunction> functions;
  std::lock_guard<std::mutex> lock(mu);
  auto it = functions.try_emplace(name, FakeFunction{name}).first;
  *f = reinterpret_cast<CUfunction>(&it->second);
  return CUDA_SUCCESS;
}
CUresult LaunchKernel(CUfunction f, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                      unsigned, CUstream stream, void** args, void**) {
  if (DeviceLost()) return CUDA_ERROR_ECC_UNCORRECTABLE;
  const std::string& name = reinterpret_cast<FakeFunction*>(f)->name;
  if (name != baton::kSpinKernel) StreamSynchronize(stream);  // stream order
  if (name == baton::kScrubHeadersKernel) {
    const CUdeviceptr base = *static_cast<CUdeviceptr*>(args[0]);
    const uint64_t block_bytes = *static_cast<uint64_t*>(args[1]);
    const uint32_t header_words = *static_cast<uint32_t*>(args[2]);
    const uint32_t blocks = *static_cast<uint32_t*>(args[3]);
    for (uint32_t b = 0; b < blocks; ++b)
      std::memset(At(base + b * block_bytes), 0, header_words * 4);
    return CUDA_SUCCESS;
  }
  if (name == baton::kSpinKernel) {
    auto* counter = static_cast<volatile uint64_t*>(At(*static_cast<CUdeviceptr*>(args[0])));
    auto* header = static_cast<volatile uint32_t*>(At(*static_cast<CUdeviceptr*>(args[1])));
    const uint32_t header_words = *static_cast<uint32_t*>(args[2]);
    const uint64_t iterations = *static_cast<uint64_t*>(args[3]);
    if (stream == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
    std::lock_guard<std::mutex> lock(StreamOf(stream)->mu);
    std::shared_ptr<std::atomic<int>> left = StreamOf(stream)->left;
    left->fetch_add(1);
    StreamOf(stream)->running.emplace_back([=] {
      for (uint64_t n = 1; n <= iterations; ++n) {
        for (uint32_t w = 0; w < header_words; ++w) header[w] = baton::kSpinHeaderWord;
        *counter = n;
      }
      left->fetch_sub(1);
    });
    return CUDA_SUCCESS;
  }
  if (name == baton::kFillKernel) {
    auto* dst = static_cast<uint32_t*>(At(*static_cast<CUdeviceptr*>(args[0])));
    const uint64_t words = *static_cast<uint64_t*>(args[1]);
    const uint32_t seed = *static_cast<uint32_t*>(args[2]);
    for (uint64_t i = 0; i < words; ++i) dst[i] = baton::FillPatternWord(i, seed);
    return CUDA_SUCCESS;
  }
  return CUDA_ERROR_NOT_SUPPORTED;
}

const Entry kVmmEntries[] = {
    BATON_FAKE("cuDeviceGet", DeviceGet),
    BATON_FAKE("cuDeviceGetCount", DeviceGetCount),
    BATON_FAKE("cuDeviceGetName", DeviceGetName),
    BATON_FAKE("cuDeviceGetAttribute", DeviceGetAttribute),
    BATON_FAKE("cuDeviceTotalMem", DeviceTotalMem),
    BATON_FAKE("cuDeviceGetPCIBusId", DeviceGetPCIBusId),
    BATON_FAKE_IN_CONTEXT("cuMemGetInfo", MemGetInfo),
    BATON_FAKE("cuMemGetAllocationGranularity", Granularity),
    BATON_FAKE("cuMemCreate", MemCreate),
    BATON_FAKE("cuMemRelease", MemRelease),
    BATON_FAKE("cuMemExportToShareableHandle", MemExport),
    BATON_FAKE("cuMemImportFromShareableHandle", MemImport),
    BATON_FAKE("cuMemAddressReserve", AddressReserve),
    BATON_FAKE("cuMemAddressFree", AddressFree),
    BATON_FAKE("cuMemMap", MemMap),
    BATON_FAKE("cuMemUnmap", MemUnmap),
    BATON_FAKE("cuMemSetAccess", MemSetAccess),
    BATON_FAKE_IN_CONTEXT("cuStreamCreate", StreamCreate),
    BATON_FAKE_IN_CONTEXT("cuStreamDestroy", StreamDestroy),
    BATON_FAKE_IN_CONTEXT("cuStreamQuery", StreamQuery),
    BATON_FAKE_IN_CONTEXT("cuStreamSynchronize", StreamSynchronize),
    BATON_FAKE_IN_CONTEXT("cuEventCreate", EventCreate),
    BATON_FAKE_IN_CONTEXT("cuEventDestroy", EventDestroy),
    BATON_FAKE_IN_CONTEXT("cuEventRecord", EventRecord),
    BATON_FAKE_IN_CONTEXT("cuEventQuery", Succeed),
    BATON_FAKE_IN_CONTEXT("cuEventElapsedTime", EventElapsed),
    BATON_FAKE_IN_CONTEXT("cuModuleLoadDataEx", ModuleLoad),
    BATON_FAKE_IN_CONTEXT("cuModuleUnload", ModuleUnload),
    BATON_FAKE_IN_CONTEXT("cuModuleGetFunction", ModuleGetFunction),
    BATON_FAKE_IN_CONTEXT("cuLaunchKernel", LaunchKernel),
};

}  // namespace

// The vmm mode's implementation of `symbol`, or nullptr (then the caller decides).
void* FakeVmmFunction(const char* symbol) {
  if (void* fn = fake_cuda::FindEntry(kVmmEntries, symbol)) return fn;
  if (void* fn = fake_cuda::ContextFunction(symbol)) return fn;
  return fake_cuda::HostFunction(symbol);
}

// NVML for the emulated device (BATON_NVML_LIBRARY pointed at this library): the processes
// on the GPU are the pids listed, one per line, in the file named by $BATON_FAKE_NVML_PIDS
// (none when it is unset or missing), so a test decides when a dead holder's context is gone.
extern "C" {

__attribute__((visibility("default"))) int nvmlInit_v2() { return 0; }

__attribute__((visibility("default"))) const char* nvmlErrorString(int result) {
  return result == 0 ? "Success" : "fake NVML error";
}

__attribute__((visibility("default"))) int nvmlDeviceGetHandleByPciBusId_v2(const char* id,
                                                                            void** device) {
  static int the_device;
  if (std::strcmp(id, "0000:00:00.0") != 0) return 6;  // NVML_ERROR_NOT_FOUND
  *device = &the_device;
  return 0;
}

struct FakeNvmlProcess {
  unsigned int pid;
  unsigned long long used_gpu_memory;
  unsigned int gpu_instance_id;
  unsigned int compute_instance_id;
};

__attribute__((visibility("default"))) int nvmlDeviceGetComputeRunningProcesses_v3(
    void*, unsigned int* count, FakeNvmlProcess* infos) {
  std::vector<unsigned int> pids;
  if (const char* path = std::getenv("BATON_FAKE_NVML_PIDS")) {
    std::ifstream in(path);
    unsigned int pid;
    while (in >> pid) pids.push_back(pid);
  }
  if (pids.size() > *count) {
    *count = static_cast<unsigned int>(pids.size());
    return 7;  // NVML_ERROR_INSUFFICIENT_SIZE
  }
  for (size_t i = 0; i < pids.size(); ++i) infos[i] = FakeNvmlProcess{pids[i], 0, 0, 0};
  *count = static_cast<unsigned int>(pids.size());
  return 0;
}

}  // extern "C"

#endif  // BATON_HAVE_CUDA_HEADERS
