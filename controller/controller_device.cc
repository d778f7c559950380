// The controller's device memory on the CUDA backend: made at start-up, probed while it
// runs, rebuilt after a GPU is lost (reset, uncorrectable error) with every engine fenced.
#include <algorithm>

#include "base/log.h"
#include "controller/controller.h"

namespace baton {
namespace {

constexpr const char* kLog = "controller";
// A device that does not finish a 4-byte copy in this long is taken as lost (hung).
constexpr Duration kDeviceProbeTimeout = std::chrono::seconds(2);

}  // namespace

// On the CUDA backend: the device copy of the weights and the device pool, made once here.
// Where they cannot be made, "auto" goes on with the host backend and says why.
Status Controller::SetUpDeviceMemory(const BackendChoice& backend, BackendMode mode) {
  if (backend.kind != MemoryBackendKind::kCuda) return OkStatus();
  device_options_ = DeviceOwnerOptions{.device = backend.device,
                                       .block_count = config_.block_count,
                                       .block_bytes = config_.block_bytes,
                                       .pool_chunk_bytes = config_.gpu_pool_chunk_bytes};
  Result<std::unique_ptr<DeviceOwner>> owner = MakeDeviceOwner();
  if (!owner.ok()) {
    const Status why = owner.status().WithContext("device memory on CUDA device " +
                                                  std::to_string(backend.device));
    if (mode == BackendMode::kCuda) return why;
    BATON_LOG(WARN, kLog) << "backend: host (" << why.message() << ")";
    return OkStatus();
  }
  device_ = std::move(owner).value();
  cuda_backend_ = true;
  next_device_probe_ = clock_.Now() + config_.gpu_probe_interval;
  BATON_LOG(INFO, kLog) << "device memory: " << device_->Describe();
  Result<std::unique_ptr<NvmlLibrary>> nvml = NvmlLibrary::Load();
  if (nvml.ok()) {
    nvml_ = std::move(nvml).value();
    BATON_LOG(INFO, kLog) << "barrier: reap, then NVML (" << nvml_->library()
                          << ") no longer lists the holder on GPU " << device_->pci_bus_id()
                          << ", then the new holder's scrub";
  } else {
    BATON_LOG(WARN, kLog) << "barrier: NVML unavailable (" << nvml.status().message()
                          << "): the reap, then the new holder's scrub";
  }
  return OkStatus();
}

Result<std::unique_ptr<DeviceOwner>> Controller::MakeDeviceOwner() const {
  const PinnedArena& arena = weights_->arena();
  return DeviceOwner::Create(device_options_, std::span<uint8_t>(arena.data(), arena.size()));
}

// Every gpu.probe_interval_ms: a lost device (a GPU reset, an uncorrectable error: the
// controller's own context fails) fences every engine, whose imports are of lost memory,
// and the device memory is made again from the pinned cache before engines start again.
void Controller::CheckDevice() {
  if (!cuda_backend_ || config_.gpu_probe_interval == Duration::zero()) return;
  const TimePoint now = clock_.Now();
  if (now < next_device_probe_) return;
  next_device_probe_ = now + config_.gpu_probe_interval;
  if (device_ == nullptr) return RebuildDevice();
  Status probe = device_->Probe(kDeviceProbeTimeout);
  if (probe.ok()) return;
  device_lost_reason_ = probe.message();
  ++device_losses_;
  BATON_LOG(ERROR, kLog) << "device lost: " << device_lost_reason_
                         << "; fencing every engine and rebuilding the device memory";
  std::vector<EngineId> ids;
  for (const auto& [id, e] : engines_) {
    if (e->live()) ids.push_back(id);
  }
  // The standby first, so that the primary's blocks are not handed to an engine that is
  // about to be fenced too.
  std::stable_partition(ids.begin(), ids.end(), [this](EngineId id) { return id != primary_; });
  for (EngineId id : ids) Fail(id, FailCause::kError, "device lost: " + device_lost_reason_);
  device_.reset();
  RebuildDevice();
}

void Controller::RebuildDevice() {
  Result<std::unique_ptr<DeviceOwner>> owner = MakeDeviceOwner();
  if (!owner.ok()) {
    // A rebuild pins the arena and copies the weights on this thread: retried with an
    // exponential backoff (the probe interval doubled per failure, up to a minute), logged
    // when the reason changes.
    ++rebuild_failures_;
    const Duration wait = std::min<Duration>(
        config_.gpu_probe_interval * (int64_t{1} << std::min<uint64_t>(rebuild_failures_, 10)),
        std::chrono::minutes(1));
    next_device_probe_ = clock_.Now() + wait;
    if (owner.status().message() != rebuild_error_) {
      rebuild_error_ = owner.status().message();
      BATON_LOG(WARN, kLog) << "device memory not rebuilt yet (retried with backoff, next in "
                            << std::chrono::duration_cast<std::chrono::milliseconds>(wait).count()
                            << " ms): " << rebuild_error_;
    }
    return;
  }
  rebuild_error_.clear();
  rebuild_failures_ = 0;
  device_ = std::move(owner).value();
  ++device_rebuilds_;
  BATON_LOG(INFO, kLog) << "device memory rebuilt from the pinned cache: " << device_->Describe();
  MaybeLaunch();
}

}  // namespace baton
