// EngineSession::Impl: a promotion before the old primary's barrier (protocol 7). The
// controller says which blocks of the old primary wait in quarantine (Quarantined, right before
// the Promote); the session maps them read-only so that the engine can copy the KV they hold
// into its own blocks, hands the wait for their Grant to an engine that would rather adopt them
// in place, and unmaps them when the engine is done with them. Nothing here maps a quarantined
// block writable: only their Grant does, once their barrier has passed (OnGrant).
#include <algorithm>

#include "base/log.h"
#include "standby/sdk/engine_session_impl.h"

namespace baton {
namespace {

constexpr const char* kLog = "engine-sdk";

}  // namespace

void EngineSession::Impl::MapQuarantinedLocked(uint64_t epoch, SessionEvent* event) {
  std::optional<proto::Quarantined> q = std::exchange(quarantined_, std::nullopt);
  if (!q.has_value() || q->epoch != epoch) return;
  event->barrier_estimate = std::chrono::microseconds(q->barrier_estimate_us);
  event->wait_limit = std::chrono::milliseconds(q->wait_limit_ms);
  for (const proto::BlockRange& r : q->extents) {
    if (device_ != nullptr) {  // the device pool's chunks are not mapped for a copy here
      event->quarantined.push_back(MappedExtent{.first = r.first, .count = r.count});
      continue;
    }
    if (Status ro = pool_.MapReadOnly(r.first, r.count); !ro.ok()) {
      BATON_LOG(WARN, kLog) << "quarantined " << ro.message() << ": not read";
      continue;
    }
    event->quarantined.push_back(ExtentOf(r.first, r.count));
    pool_.CopyHeaders(r.first, r.count, kBlockHeaderBytes, &event->quarantined_headers);
  }
}

Result<SessionEvent> EngineSession::Impl::WaitForInheritedBlocks(Duration timeout) {
  MutexLock lock(mu_);
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
    if (cv_.WaitUntil(mu_, deadline) == std::cv_status::timeout) {
      return DeadlineExceeded("the quarantined blocks did not come within the wait limit");
    }
  }
}

void EngineSession::Impl::ReleaseQuarantined() {
  MutexLock lock(mu_);
  pool_.UnmapReadOnly();
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

void EngineSession::ReleaseQuarantined() { impl_->ReleaseQuarantined(); }

Status EngineSession::ReportKvInheritance(const KvInheritanceSummary& summary) {
  return impl_->ReportKvInheritance(summary);
}

}  // namespace baton
