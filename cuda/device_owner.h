// DeviceOwner: the controller's device memory on the CUDA backend.
//
// Create() (at start-up, never on the promotion path) retains the device's primary context,
// page-locks the host weight arena with cuMemHostRegister in chunks (the pinned host cache;
// cuda/memory/pinned_host.h: READ_ONLY for an arena the process maps read-only; where the
// driver refuses, the arena is copied from pageable memory, slower, and stats say why),
// creates the "weights" VMM region and fills it from the arena with
// the multi-stream rematerializer (cuda/memory/rematerializer.h), and creates the "pool" VMM region
// with the host pool's geometry: block b at offset b x block_bytes. Pool chunks hold whole
// blocks and are a multiple of the allocation granularity, as large as `pool_chunk_bytes`
// allows, so mapping the pool is a few hundred cuMemMap calls at most.
// Share() sends both regions (weights read-only, pool writable) to an engine right after its
// RegisterAck; the engine answers each with a ShareMemoryAck (cuda/device_session.h).
// Rematerialize() rebuilds the device copy from the pinned cache (after a GPU reset).
// The region fds are exported per Share(); the owner keeps the allocations for its whole
// life, so engines that die and come back map the same device memory.
// ExportForKeeping() hands both regions' chunk fds to baton-keeper, so that they outlive the
// controller; Adopt() is the restarted controller's Create(): it imports those fds instead of
// allocating and copying, proves the chunks (geometry, each one mapped at its size, a sample
// of the weights equal to the arena, a probe) and refuses anything else with the reason. It
// does not pin the arena: nothing is copied, and the pinned cache serves only a rebuild,
// which a lost device gets from a new owner (Create) that pins then.
// Header-independent: without the CUDA toolkit Create() is Unimplemented. Thread-compatible.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/io/unique_fd.h"
#include "base/status.h"
#include "proto/transport/channel.h"

namespace baton {

struct DeviceOwnerOptions {
  int device = 0;
  // The process maps the arena read-only (an adopted arena): it is pinned with
  // CU_MEMHOSTREGISTER_READ_ONLY, which the driver requires for such memory.
  bool arena_read_only = false;
  uint32_t block_count = 0;
  uint64_t block_bytes = 0;
  uint64_t weights_chunk_bytes = 256ull << 20;
  uint64_t pool_chunk_bytes = 256ull << 20;  // the most a pool chunk may hold
  int remat_streams = 4;
};

// How the arena, the source of the device copy, is pinned for the copy.
enum class HostPin {
  kNotNeeded,  // adopted device memory: nothing copied, so nothing pinned
  kPinned,     // cuMemHostRegister
  kReadOnly,   // cuMemHostRegister with CU_MEMHOSTREGISTER_READ_ONLY (a read-only mapping)
  kPageable,   // pinning refused (DeviceOwnerStats::pinned says why): copies staged by the driver
};
const char* ToString(HostPin pin);

struct DeviceOwnerStats {
  HostPin pin = HostPin::kNotNeeded;
  std::string pinned;  // how the host cache was pinned, or why it is not
  double pin_ms = 0;
  uint64_t weights_bytes = 0;
  uint32_t weights_chunks = 0;
  double remat_ms = 0;
  double remat_gbps = 0;
  uint64_t copied_bytes = 0;  // host-to-device bytes this owner copied (0 when adopted)
  uint64_t pool_bytes = 0;
  uint64_t pool_chunk_bytes = 0;
  uint32_t pool_chunks = 0;
  bool adopted = false;  // Adopt(): kept device memory taken back, nothing copied
};

// One region's chunks as baton-keeper keeps them: one fd per chunk, in order.
struct KeptDeviceRegion {
  uint64_t chunk_bytes = 0;
  std::vector<UniqueFd> fds;
};
struct KeptDeviceMemory {
  KeptDeviceRegion weights;
  KeptDeviceRegion pool;
};

// The pool chunk size: the largest multiple of lcm(block_bytes, granularity) that is at most
// max(limit, that lcm), and no larger than the pool rounded up to that lcm.
// InvalidArgument for a zero block size, granularity or pool.
Result<uint64_t> PoolChunkBytes(uint64_t block_bytes, uint64_t granularity, uint64_t pool_bytes,
                                uint64_t limit);

class DeviceOwner {
 public:
  static Result<std::unique_ptr<DeviceOwner>> Create(const DeviceOwnerOptions& options,
                                                     std::span<uint8_t> arena);
  // Takes back the regions an earlier owner exported (ExportForKeeping) over the same
  // `arena` contents: pins the arena, imports both regions, checks that their chunk geometry
  // is what Create() would make with `options` for this arena, maps every chunk (the
  // driver refuses a smaller allocation), compares `verify_samples` 4 KiB windows of the
  // device weights (the first and last included) with the arena and probes the device.
  // Nothing is copied. FailedPrecondition (with the reason) when the kept memory does not fit.
  static Result<std::unique_ptr<DeviceOwner>> Adopt(const DeviceOwnerOptions& options,
                                                    std::span<uint8_t> arena, KeptDeviceMemory kept,
                                                    uint32_t verify_samples = 64);
  ~DeviceOwner();
  DeviceOwner(const DeviceOwner&) = delete;
  DeviceOwner& operator=(const DeviceOwner&) = delete;

  // Sends the "weights" and "pool" regions (kDeviceRegionCount of them) on `channel`.
  Status Share(proto::Channel& channel) const;
  // Dups of both regions' chunk fds, in order, for baton-keeper.
  Result<KeptDeviceMemory> ExportForKeeping() const;
  // Copies the arena into the device weights again.
  Status Rematerialize();
  // A 4-byte read of the device weights on the owner's context, into pinned memory on a
  // stream of its own, waited for at most `timeout`: an error (or DeadlineExceeded, a GPU
  // that no longer completes work) means the device or the context is lost (a GPU reset, an
  // uncorrectable error) and the memory must be made again (a new DeviceOwner).
  Status Probe(Duration timeout) const;

  int device() const { return device_; }
  // "0000:3B:00.0": the device's PCI address, as NVML names it.
  const std::string& pci_bus_id() const { return pci_bus_id_; }
  const DeviceOwnerStats& stats() const { return stats_; }
  // "weights 2.1 GB in 9 chunks (rematerialized at 24.1 GB/s), pool 4.0 GB in 16 chunks of 256 MiB"
  std::string Describe() const;

 private:
  struct Impl;
  DeviceOwner();
  // Create() and Adopt(): the context and the PCI id.
  static Result<std::unique_ptr<DeviceOwner>> Begin(const DeviceOwnerOptions& options,
                                                    std::span<uint8_t> arena);
  // After both regions are there: the weights view, the probe's stream and buffer, stats.
  Status Finish();
  Status VerifyWeights(uint32_t samples) const;
  // Pins the arena for the copy once; where the driver refuses, the copy reads pageable
  // memory (logged, and stats say why). Never fails.
  void PinArena();

  std::unique_ptr<Impl> impl_;
  int device_ = -1;
  std::string pci_bus_id_;
  DeviceOwnerStats stats_;
};

}  // namespace baton
