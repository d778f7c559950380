// DevicePart: the Coordinator's part for the CUDA backend's device. Every
// gpu.probe_interval_ms the device is probed; a lost device (a GPU reset, an uncorrectable
// error: the controller's own context fails) fences every engine, whose imports are of lost
// memory, and the device memory is made again from the pinned cache (retried with a backoff)
// before engines start again. Also the engines' answers to the device regions offered to
// them (ShareMemoryAck). Nothing to do on the host backend (coordinator_device.cc).
//
// Ownership: owns DeviceFields; borrows the shared state and the other parts
// (coordinator_parts.h). Thread: the Coordinator's.
#pragma once

#include <cstdint>
#include <string>

#include "controller/core/coordinator_state.h"

namespace baton {

struct CoordinatorParts;

struct DeviceFields {
  TimePoint next_probe{};
  uint64_t losses = 0;
  uint64_t rebuilds = 0;
  std::string lost_reason;
  std::string rebuild_error;  // the last rebuild's, logged when it changes
  uint64_t rebuild_failures = 0;
};

class DevicePart {
 public:
  DevicePart(CoordinatorState& s, const CoordinatorParts& p);

  const DeviceFields& own() const { return own_; }
  // The controller starts: the backend and the device pool's chunk as found; the first probe
  // is due one interval from now.
  void Start(const StartState& found);
  // When the next probe is due (nullopt: none, on the host backend or with probes off).
  std::optional<TimePoint> NextProbeAt() const;
  // Probes the device when due; a lost one is dropped, every engine fenced, and rebuilt.
  void CheckDevice();
  void OnShareMemoryAck(EngineRecord& e, const proto::ShareMemoryAck& msg);

 private:
  void RebuildDevice();

  CoordinatorState& s_;
  const CoordinatorParts& p_;
  DeviceFields own_;
};

}  // namespace baton
