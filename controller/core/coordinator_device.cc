// DevicePart: the CUDA backend's device, probed, and rebuilt once lost (coordinator_device.h).
#include <algorithm>

#include "base/log.h"
#include "controller/core/coordinator_parts.h"

namespace baton {

namespace {

constexpr const char* kLog = "controller";

}  // namespace

DevicePart::DevicePart(CoordinatorState& s, const CoordinatorParts& p) : s_(s), p_(p) {}

void DevicePart::Start(const StartState& found) {
  s_.cuda_backend = found.cuda_backend;
  own_.next_probe = s_.clock.Now() + s_.config.gpu_probe_interval;
  if (found.blocks_per_chunk <= 1) return;
  if (Status s = s_.ledger->SetBlocksPerChunk(found.blocks_per_chunk); !s.ok()) {
    BATON_LOG(ERROR, kLog) << "pool chunks: " << s.ToString();
  }
}

std::optional<TimePoint> DevicePart::NextProbeAt() const {
  if (!s_.cuda_backend || s_.config.gpu_probe_interval <= Duration::zero()) return std::nullopt;
  return own_.next_probe;
}

// Every gpu.probe_interval_ms: a lost device (a GPU reset, an uncorrectable error: the
// controller's own context fails) fences every engine, whose imports are of lost memory,
// and the device memory is made again from the pinned cache before engines start again.
void DevicePart::CheckDevice() {
  if (!s_.cuda_backend || s_.config.gpu_probe_interval == Duration::zero()) return;
  const TimePoint now = s_.clock.Now();
  if (now < own_.next_probe) return;
  own_.next_probe = now + s_.config.gpu_probe_interval;
  if (!s_.effects.DeviceMemoryPresent()) return RebuildDevice();
  Status probe = s_.effects.ProbeDevice();
  if (probe.ok()) return;
  own_.lost_reason = probe.message();
  ++own_.losses;
  BATON_LOG(ERROR, kLog) << "device lost: " << own_.lost_reason
                         << "; fencing every engine and rebuilding the device memory";
  std::vector<EngineId> ids;
  for (const auto& [id, e] : s_.engines) {
    if (e->live() && s_.mutation != CoordinatorMutation::kDeviceLossFencesNothing)
      ids.push_back(id);
  }
  // The standby first, so that the primary's blocks are not handed to an engine that is
  // about to be fenced too.
  std::stable_partition(ids.begin(), ids.end(), [this](EngineId id) { return id != s_.primary; });
  for (EngineId id : ids)
    p_.failover->Fence(id, FailCause::kError, "device lost: " + own_.lost_reason);
  s_.effects.DropDevice();
  RebuildDevice();
}

void DevicePart::RebuildDevice() {
  Status rebuilt = s_.effects.RebuildDevice();
  if (!rebuilt.ok()) {
    // A rebuild pins the arena and copies the weights on this thread: retried with an
    // exponential backoff (the probe interval doubled per failure, up to a minute), logged
    // when the reason changes.
    ++own_.rebuild_failures;
    const Duration wait =
        std::min<Duration>(s_.config.gpu_probe_interval *
                               (int64_t{1} << std::min<uint64_t>(own_.rebuild_failures, 10)),
                           std::chrono::minutes(1));
    own_.next_probe = s_.clock.Now() + wait;
    if (rebuilt.message() != own_.rebuild_error) {
      own_.rebuild_error = rebuilt.message();
      BATON_LOG(WARN, kLog) << "device memory not rebuilt yet (retried with backoff, next in "
                            << std::chrono::duration_cast<std::chrono::milliseconds>(wait).count()
                            << " ms): " << own_.rebuild_error;
    }
    return;
  }
  own_.rebuild_error.clear();
  own_.rebuild_failures = 0;
  ++own_.rebuilds;
  p_.engines->MaybeLaunch();
}

void DevicePart::OnShareMemoryAck(EngineRecord& e, const proto::ShareMemoryAck& msg) {
  if (!s_.cuda_backend || !s_.effects.DeviceMemoryPresent() || !e.is(EngineState::kRegistering)) {
    return p_.engines->RefuseEngine(e,
                                    FailedPrecondition("ShareMemoryAck for '" + msg.name +
                                                       "' without device regions being offered"));
  }
  if (msg.mapped) {
    BATON_LOG(INFO, kLog) << "engine " << e.id << " took device region '" << msg.name << "'";
    if (e.device_memory.empty()) e.device_memory = "mapped";
    return;
  }
  BATON_LOG(WARN, kLog) << "engine " << e.id << " declined device region '" << msg.name
                        << "': " << msg.detail << "; it uses the host arena and pool";
  e.device_memory = msg.detail;
}

}  // namespace baton
