// Kept memory: what the controller leaves with baton-keeper (controller/keeper/) so that its
// successor adopts the weights and the pool instead of loading the model again, and how the
// successor proves that what it finds is complete and is the configured model's.
//
// Two host items are kept: "weights" (the arena memfd, with a WeightManifest written after the
// load finished and the arena was sealed: weightcache/weight_manifest.h) and "pool" (the pool
// memfd, with a PoolManifest of its geometry). Each manifest carries a random generation; the
// controller writes both generations to <state_dir>/memory.json once the keeper holds them
// (MemoryRecord, fsynced). A successor adopts an item only when the keeper's manifest names the
// generation the record names, its checks pass (the model files unchanged, the same geometry,
// the memfd's size and seals) and the memfd is what the manifest describes; anything else is
// refused with the reason and made afresh. Plain values and functions; thread-compatible.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "base/status.h"

namespace baton {

struct PoolManifest {
  static constexpr int kFormat = 1;
  uint32_t block_count = 0;
  uint64_t block_bytes = 0;
  uint64_t bytes = 0;  // the memfd's size
  bool huge_pages = false;
  uint64_t generation = 0;
  bool operator==(const PoolManifest&) const = default;
};
std::string EncodePoolManifest(const PoolManifest& m);
Result<PoolManifest> DecodePoolManifest(const std::string& text, const std::string& where);
// Why a kept pool cannot serve a controller configured with this geometry ("" if it can).
std::string PoolMismatch(const PoolManifest& kept, uint32_t block_count, uint64_t block_bytes,
                         uint64_t memfd_bytes);

// On the CUDA backend the device copy of the weights and the device pool are kept too: their
// chunk fds (exported VMM allocations) in parts of at most kDeviceFdsPerPart fds, under
// "device.weights.<k>" and "device.pool.<k>" (each with a DevicePartManifest), then a
// DeviceManifest under "device" (no fds) once every part is kept. The device copy is adopted
// only together with the host weights and pool it was made from (their generations).
inline constexpr const char* kKeptDeviceName = "device";
inline constexpr size_t kDeviceFdsPerPart = 16;  // proto::kMaxFdsPerFrame
// "device.weights.3"
std::string DevicePartName(const std::string& region, uint32_t part);

struct DeviceRegionManifest {
  uint64_t chunk_bytes = 0;
  uint32_t chunks = 0;
  uint32_t parts = 0;  // ceil(chunks / kDeviceFdsPerPart)
  bool operator==(const DeviceRegionManifest&) const = default;
};

struct DeviceManifest {
  static constexpr int kFormat = 1;
  uint64_t generation = 0;
  uint64_t weights_generation = 0;  // the host weights the device copy was made from
  uint64_t pool_generation = 0;     // the host pool kept with it
  int device = 0;
  std::string pci_bus_id;
  uint32_t block_count = 0;
  uint64_t block_bytes = 0;
  DeviceRegionManifest weights;
  DeviceRegionManifest pool;
  bool operator==(const DeviceManifest&) const = default;
};
std::string EncodeDeviceManifest(const DeviceManifest& m);
Result<DeviceManifest> DecodeDeviceManifest(const std::string& text, const std::string& where);
// Why kept device memory cannot serve a controller whose adopted host memory and device are
// `now` (generation and chunk geometry are not compared: the owner checks the chunks)
// ("" if it can). Also refuses a manifest whose part counts do not cover its chunks.
std::string DeviceMismatch(const DeviceManifest& kept, const DeviceManifest& now);

struct DevicePartManifest {
  uint64_t generation = 0;  // the DeviceManifest's
  uint32_t part = 0;
  uint32_t first_chunk = 0;
  uint32_t chunks = 0;  // = the fds kept with it
  bool operator==(const DevicePartManifest&) const = default;
};
std::string EncodeDevicePartManifest(const DevicePartManifest& m);
Result<DevicePartManifest> DecodeDevicePartManifest(const std::string& text,
                                                    const std::string& where);

struct MemoryRecord {
  uint64_t weights_generation = 0;
  uint64_t pool_generation = 0;
  uint64_t device_generation = 0;  // 0: no device memory kept (optional in the file)
  bool operator==(const MemoryRecord&) const = default;
};
Status SaveMemoryRecord(const std::string& path, const MemoryRecord& record);
// nullopt when there is none; InvalidArgument naming the file when it does not parse. A record
// without "device_generation" (written before device memory was kept) reads as 0.
Result<std::optional<MemoryRecord>> LoadMemoryRecord(const std::string& path);

// 64 random bits (getrandom), never 0.
Result<uint64_t> NewGeneration();

}  // namespace baton
