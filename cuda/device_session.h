// DeviceSession: an engine's device memory on the CUDA backend, as the engine SDK
// (standby/sdk/engine_sdk.h) uses it, in types that need no CUDA header.
//
// On a CUDA-backend controller, RegisterAck says which device holds the memory and how many
// VMM regions follow it on the channel (cuda/memory/vmm_share.h): "weights", the device copy of the
// weight arena, and "pool", the device KV pool with the host pool's block geometry.
//   Accept()  takes them with a DeviceBorrower (cuda/device_borrower.h): the weights are
//             imported and mapped READ at once, the pool's range is only reserved (fencing
//             rule 5). Where the device cannot be used (no driver, build without CUDA) it
//             refuses every region with the reason and returns that reason.
//   Decline() receives every region and refuses it: an engine that computes on the host uses
//             the host arena and pool it already has. It returns the pool region's chunk size
//             (0 when none came): the ledger lends that pool by whole chunks all the same, so
//             the engine answers a Reclaim with whole chunks too.
// MapBlocks()/UnmapBlocks() follow the engine's leases: whole chunks are mapped for held
// blocks and unmapped when none is left (cuda/memory/chunk_cover.h); the granted blocks' headers
// are scrubbed on the engine's stream before MapBlocks returns. Addresses are CUdeviceptr values:
// tensor t of the weights is at weights().address + (t.data - host arena base), the same offsets as
// in the host arena. Thread-compatible: one thread at a time (the SDK calls it under its lock).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "base/clock.h"
#include "base/status.h"
#include "proto/transport/channel.h"

namespace baton {

inline constexpr char kDeviceWeightsRegion[] = "weights";
inline constexpr char kDevicePoolRegion[] = "pool";
inline constexpr uint32_t kDeviceRegionCount = 2;

struct DeviceRegionView {
  int device = -1;
  uint64_t address = 0;  // CUdeviceptr of the region's reserved range
  uint64_t bytes = 0;
  uint64_t chunk_bytes = 0;
  uint32_t chunks = 0;
};

class DeviceSession {
 public:
  static Result<std::unique_ptr<DeviceSession>> Accept(proto::Channel& channel, int device,
                                                       uint32_t regions, Duration timeout);
  static Result<uint64_t> Decline(proto::Channel& channel, uint32_t regions, const std::string& why,
                                  Duration timeout);
  ~DeviceSession();
  DeviceSession(const DeviceSession&) = delete;
  DeviceSession& operator=(const DeviceSession&) = delete;

  const DeviceRegionView& weights() const { return weights_; }
  const DeviceRegionView& pool() const { return pool_; }

  Status MapBlocks(uint32_t first, uint32_t count, uint64_t block_bytes, uint32_t block_count,
                   uint32_t header_bytes, Duration timeout);
  Status UnmapBlocks(uint32_t first, uint32_t count);

 private:
  struct Impl;
  DeviceSession();

  std::unique_ptr<Impl> impl_;
  DeviceRegionView weights_;
  DeviceRegionView pool_;
};

}  // namespace baton
