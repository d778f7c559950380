// EngineSession::Impl: a promotion before the old primary's barrier (protocol 7). The
// controller says which blocks of the old primary wait in quarantine (Quarantined, right before
// the Promote); the session reads their headers from the pool's file at the promotion, without
// mapping them, so that the promotion neither faults their pages in nor unmaps them after.
// An engine that copies the KV they hold maps them read-only then (MapQuarantined: on a device
// pool the device chunks that hold them too, READ, for a device-to-device copy); one that
// would rather adopt them in place waits for their Grant; either unmaps what it mapped when
// done (ReleaseQuarantined). Nothing here maps a quarantined block writable: only their Grant
// does, once their barrier has passed (OnGrant). A restarted controller that cannot account
// for them says so with an empty Quarantined after the Promote (OnQuarantined): the wait ends.
#include <sched.h>

#include <algorithm>
#include <vector>

#include "base/log.h"
#include "standby/sdk/engine_session_impl.h"

namespace baton {
namespace {

constexpr const char* kLog = "engine-sdk";

// Threads that read the quarantined blocks' headers at a promotion: the CPUs this process may
// run on, at most 8, so that a promotion does not take every core of the host.
unsigned HeaderReadThreads() {
  cpu_set_t cpus;
  if (sched_getaffinity(0, sizeof(cpus), &cpus) != 0) return 1;
  return static_cast<unsigned>(std::clamp(CPU_COUNT(&cpus), 1, 8));
}

}  // namespace

void EngineSession::Impl::ReadQuarantinedLocked(uint64_t epoch, SessionEvent* event) {
  std::optional<proto::Quarantined> q = std::exchange(quarantined_, std::nullopt);
  quarantined_ranges_.clear();
  if (!q.has_value() || q->epoch != epoch) return;
  event->barrier_estimate = std::chrono::microseconds(q->barrier_estimate_us);
  event->wait_limit = std::chrono::milliseconds(q->wait_limit_ms);
  // On a device pool too: a block's record lies in the host pool block of its number, so an
  // engine that finds records of its own there waits for their Grant to adopt them in place.
  std::vector<BlockRun> runs;
  runs.reserve(q->extents.size());
  for (const proto::BlockRange& r : q->extents)
    runs.push_back({.first = r.first, .count = r.count});
  const std::vector<Status> read =
      pool_.ReadHeaders(runs, kBlockHeaderBytes, HeaderReadThreads(), &event->quarantined_headers);
  for (size_t i = 0; i < runs.size(); ++i) {
    const proto::BlockRange& r = q->extents[i];
    if (!read[i].ok()) {
      BATON_LOG(WARN, kLog) << "quarantined blocks [" << r.first << ", +" << r.count
                            << "): " << read[i].message() << ": not read";
      continue;
    }
    const uint64_t bytes = device_ != nullptr ? 0 : uint64_t{r.count} * pool_.block_bytes();
    event->quarantined.push_back(MappedExtent{.first = r.first, .count = r.count, .bytes = bytes});
    quarantined_ranges_.push_back(r);
  }
}

void EngineSession::Impl::OnQuarantined(proto::Quarantined msg) {
  MutexLock lock(mu_);
  if (!promoted_) {
    quarantined_ = std::move(msg);
    return;
  }
  if (msg.epoch != epoch_.load() || !msg.extents.empty() || quarantined_ranges_.empty()) return;
  BATON_LOG(WARN, kLog) << "the controller will not grant the old primary's quarantined blocks "
                           "(it could not account for them): their kv is replayed";
  inherit_abandoned_ = true;
  // An engine copying them (not waiting) keeps their ranges until ReleaseQuarantined: its
  // copy's records are read again after it, as for any copy before the barrier.
  if (inherit_waiting_) quarantined_ranges_.clear();
  cv_.NotifyAll();
}

// The host pool blocks (their records) read-only; on a device pool also the device chunks
// that hold their KV, READ, for a device-to-device copy.
Status EngineSession::Impl::MapQuarantinedRunLocked(uint32_t first, uint32_t count) {
  for (uint32_t b = first; b < first + count; ++b) {
    if (!pool_.IsReadOnly(b)) {
      BATON_RETURN_IF_ERROR(pool_.MapReadOnly(first, count));
      break;
    }
  }
  if (device_ == nullptr) return OkStatus();
  return device_->MapForReading(first, count, pool_.block_bytes(), pool_.block_count());
}

Result<std::vector<MappedExtent>> EngineSession::Impl::MapQuarantined() {
  MutexLock lock(mu_);
  std::vector<MappedExtent> mapped;
  for (const proto::BlockRange& r : quarantined_ranges_) {
    BATON_RETURN_IF_ERROR(MapQuarantinedRunLocked(r.first, r.count));
    mapped.push_back(ExtentOf(r.first, r.count));
  }
  return mapped;
}

Status EngineSession::Impl::MapQuarantined(std::span<const uint32_t> blocks) {
  MutexLock lock(mu_);
  for (uint32_t b : blocks) {
    const bool quarantined = std::any_of(
        quarantined_ranges_.begin(), quarantined_ranges_.end(),
        [b](const proto::BlockRange& r) { return b >= r.first && b - r.first < r.count; });
    if (!quarantined) {
      return FailedPrecondition("block " + std::to_string(b) + " is not in quarantine");
    }
  }
  // Runs of consecutive blocks, one mapping each.
  for (size_t i = 0; i < blocks.size();) {
    size_t j = i + 1;
    while (j < blocks.size() && blocks[j] == blocks[j - 1] + 1) ++j;
    BATON_RETURN_IF_ERROR(MapQuarantinedRunLocked(blocks[i], static_cast<uint32_t>(j - i)));
    i = j;
  }
  return OkStatus();
}

Result<SessionEvent> EngineSession::Impl::WaitForInheritedBlocks(Duration timeout) {
  MutexLock lock(mu_);
  inherit_waiting_ = true;
  cv_.NotifyAll();  // a Grant held back for the promotion (OnGrant) is mapped now
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    for (auto it = events_.begin(); it != events_.end(); ++it) {
      if (it->kind == SessionEventKind::kGranted && !it->inherited_headers.empty()) {
        SessionEvent event = std::move(*it);
        events_.erase(it);
        return event;
      }
      if (it->kind == SessionEventKind::kStop || it->kind == SessionEventKind::kDisconnected) {
        return FailedPrecondition(std::string("no inherited blocks: ") + ToString(it->kind) + ": " +
                                  it->reason);
      }
    }
    if (stopped_.has_value()) return FailedPrecondition("no inherited blocks: told to stop");
    if (inherit_abandoned_) {
      return NotFound("no inherited blocks: the controller will not grant them");
    }
    if (cv_.WaitUntil(mu_, deadline) == std::cv_status::timeout) {
      return DeadlineExceeded("the quarantined blocks did not come within the wait limit");
    }
  }
}

void EngineSession::Impl::ReleaseQuarantined() {
  MutexLock lock(mu_);
  quarantined_ranges_.clear();
  pool_.UnmapReadOnly();
  if (device_ == nullptr) return;
  if (Status unmapped = device_->UnmapRead(); !unmapped.ok()) {
    BATON_LOG(WARN, kLog) << "the quarantined chunks read for a copy: " << unmapped.message();
  }
}

Status EngineSession::Impl::ReportKvInheritance(const KvInheritanceSummary& summary) {
  if (protocol_.load() < proto::kProtocolVersionQuarantine) return OkStatus();
  const auto micros = [](double ms) {
    return static_cast<uint32_t>(std::clamp(ms * 1e3, 0.0, 4e9));
  };
  proto::KvInheritMode mode = proto::KvInheritMode::kNone;
  if (summary.mode == KvInheritMode::kCopied) mode = proto::KvInheritMode::kCopied;
  if (summary.mode == KvInheritMode::kWaited) mode = proto::KvInheritMode::kWaited;
  return SendOrDefer(proto::KvInherited{.epoch = epoch_.load(),
                                        .mode = static_cast<uint8_t>(mode),
                                        .blocks = summary.blocks,
                                        .bytes = summary.bytes,
                                        .micros = micros(summary.ms),
                                        .estimate_us = micros(summary.estimate_ms)});
}

// --- the public API -----------------------------------------------------------------------------

Result<SessionEvent> EngineSession::WaitForInheritedBlocks(Duration timeout) {
  return impl_->WaitForInheritedBlocks(timeout);
}

Result<std::vector<MappedExtent>> EngineSession::MapQuarantined() {
  return impl_->MapQuarantined();
}

Status EngineSession::MapQuarantined(std::span<const uint32_t> blocks) {
  return impl_->MapQuarantined(blocks);
}

void EngineSession::ReleaseQuarantined() { impl_->ReleaseQuarantined(); }

Status EngineSession::ReportKvInheritance(const KvInheritanceSummary& summary) {
  return impl_->ReportKvInheritance(summary);
}

}  // namespace baton
