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
// Each of them also comes in two halves, so that an engine heartbeats while it takes the
// memory (CUDA context creation and mapping take long on a GPU): Receive() takes the regions
// off the channel and nothing more; Take() (Accept's work) and Refuse() (Decline's) then
// run off the channel and answer each region through `ack`, which the caller sends.
// MapBlocks()/UnmapBlocks() follow the engine's leases: whole chunks are mapped for held
// blocks and unmapped when none is left (cuda/memory/chunk_cover.h); the granted blocks' headers
// are scrubbed on the engine's stream before MapBlocks returns. MapForReading()/UnmapRead():
// a dead predecessor's chunks, read-only, for a copy of its KV before their barrier. Addresses are
// CUdeviceptr values: tensor t of the weights is at weights().address + (t.data - host arena base),
// the same offsets as in the host arena. Thread-compatible: one thread at a time (the SDK calls it
// under its lock).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/status.h"
#include "cuda/memory/vmm_share.h"
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
  // The weights: false where the driver refused read-only access and they are mapped
  // read-write (AcceptedRegion::read_only).
  bool read_only = true;
};

class DeviceSession {
 public:
  static Result<std::unique_ptr<DeviceSession>> Accept(proto::Channel& channel, int device,
                                                       uint32_t regions, Duration timeout);
  static Result<uint64_t> Decline(proto::Channel& channel, uint32_t regions, const std::string& why,
                                  Duration timeout);

  // Sends the owner the answer for one region (a ShareMemoryAck).
  using AckFn = std::function<Status(const std::string& region, const Status& outcome)>;
  static Result<std::vector<ReceivedVmmRegion>> Receive(proto::Channel& channel, uint32_t regions,
                                                        Duration timeout);
  static Result<std::unique_ptr<DeviceSession>> Take(int device,
                                                     std::vector<ReceivedVmmRegion> regions,
                                                     const AckFn& ack);
  static Result<uint64_t> Refuse(const std::vector<ReceivedVmmRegion>& regions,
                                 const std::string& why, const AckFn& ack);
  ~DeviceSession();
  DeviceSession(const DeviceSession&) = delete;
  DeviceSession& operator=(const DeviceSession&) = delete;

  const DeviceRegionView& weights() const { return weights_; }
  const DeviceRegionView& pool() const { return pool_; }

  Status MapBlocks(uint32_t first, uint32_t count, uint64_t block_bytes, uint32_t block_count,
                   uint32_t header_bytes, Duration timeout);
  Status UnmapBlocks(uint32_t first, uint32_t count);
  // A dead predecessor's quarantined blocks, for a copy of their KV: the chunks that hold
  // them and none of this engine's blocks are mapped READ (DeviceBorrower::MapForReading), and
  // unmapped by UnmapRead() once every copy out of them has finished. Their Grant (MapBlocks)
  // makes them writable in place.
  Status MapForReading(uint32_t first, uint32_t count, uint64_t block_bytes, uint32_t block_count);
  Status UnmapRead();

 private:
  struct Impl;
  DeviceSession();

  std::unique_ptr<Impl> impl_;
  DeviceRegionView weights_;
  DeviceRegionView pool_;
};

}  // namespace baton
