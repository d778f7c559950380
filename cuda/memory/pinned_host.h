// PinnedHostCache: the weight cache's host copy made DMA-able for the GPU, set up once at
// start-up and never on the promotion path.
//
// Two ways, chosen by what the driver supports:
//   host-NUMA  cuMemCreate with CU_MEM_LOCATION_TYPE_HOST_NUMA on the GPU's NUMA node
//              (CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID), mapped with device and CPU access: pinned
//              by construction, on the right node, exportable like a device region. Needs
//              CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED (CUDA 12.2+).
//   registered an existing host range (the memfd arena of weightcache/io/pinned_arena.h)
//              page-locked with cuMemHostRegister in chunks (one call per chunk keeps each
//              registration bounded and lets a failure name the chunk). A range the process
//              maps read-only (an adopted, sealed arena) is registered with
//              CU_MEMHOSTREGISTER_READ_ONLY, which the driver requires for it on hosts whose
//              GPU does not use the host's page tables (x86), and only where the device has
//              CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED.
//   pageable   not pinned (where pinning was refused): the same range, copied from pageable
//              memory, which the driver stages through its own pinned buffers at a fraction of
//              the speed. note() says why.
// A copy from data() must not run past the end of the registration or allocation it starts
// in (the driver refuses it): copy in pieces that stay within copy_unit().
// Move-only; owns the allocation, mappings or registrations. The context passed in must
// outlive it. Thread-compatible.
#pragma once

#ifdef BATON_HAVE_CUDA_HEADERS

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "cuda/driver/cuda_handles.h"
#include "cuda/memory/vmm.h"

namespace baton {

enum class PinnedHostKind { kHostNuma, kRegistered, kPageable };
const char* ToString(PinnedHostKind kind);

struct PinnedHostOptions {
  uint64_t bytes = 0;
  uint64_t chunk_bytes = 1ull << 30;
  int numa_node = -1;  // -1: the GPU's node
  bool allow_host_numa = true;
};

struct HostNumaSupport {
  bool supported = false;
  int numa_node = 0;
  std::string reason;  // why not, when unsupported
};
// Whether the device can allocate host-NUMA VMM memory, and on which node.
HostNumaSupport QueryHostNuma(const PrimaryContext& ctx);
// CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED: whether cuMemHostRegister takes
// CU_MEMHOSTREGISTER_READ_ONLY on this device (false where the driver does not answer).
bool ReadOnlyRegisterSupported(const PrimaryContext& ctx);

class PinnedHostCache {
 public:
  PinnedHostCache() = default;
  static Result<PinnedHostCache> CreateHostNuma(const PrimaryContext& ctx,
                                                const PinnedHostOptions& options);
  // `read_only`: the process maps the range read-only; registered with
  // CU_MEMHOSTREGISTER_READ_ONLY (FailedPrecondition where the device does not support it).
  static Result<PinnedHostCache> Register(const PrimaryContext& ctx, uint8_t* data, uint64_t bytes,
                                          uint64_t chunk_bytes, bool read_only = false);
  // The range as it is, not pinned, because of `why`.
  static PinnedHostCache Pageable(uint8_t* data, uint64_t bytes, const std::string& why);
  // Host-NUMA where supported and allowed; otherwise registers `fallback` (which must hold
  // options.bytes). note() says which and why.
  static Result<PinnedHostCache> Create(const PrimaryContext& ctx, const PinnedHostOptions& options,
                                        std::span<uint8_t> fallback);

  uint8_t* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }
  // The longest copy from data() + k * copy_unit() that stays within one registration: the
  // chunk size, registered or host-NUMA (one cuMemCreate allocation per chunk: the driver
  // takes the host side of a copy from one allocation).
  uint64_t copy_unit() const { return copy_unit_; }
  PinnedHostKind kind() const { return kind_; }
  bool read_only() const { return read_only_; }
  int numa_node() const { return numa_node_; }
  const std::string& note() const { return note_; }
  double setup_ms() const { return setup_ms_; }

 private:
  uint8_t* data_ = nullptr;
  uint64_t bytes_ = 0;
  uint64_t copy_unit_ = 0;
  PinnedHostKind kind_ = PinnedHostKind::kRegistered;
  bool read_only_ = false;
  int numa_node_ = -1;
  std::string note_;
  double setup_ms_ = 0;
  VmmRegion region_;  // host-NUMA: the allocation, then the view that maps it
  VmmView view_;
  std::vector<HostRegistration> registrations_;
};

}  // namespace baton

#endif  // BATON_HAVE_CUDA_HEADERS
