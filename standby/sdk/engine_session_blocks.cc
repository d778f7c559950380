// EngineSession::Impl: the blocks a promotion or a grant lends the engine, mapped writable on
// the heartbeat thread (their headers scrubbed a slice at a time, heartbeats between the
// slices), and the events that tell the engine about them.
#include <algorithm>
#include <sstream>

#include "base/log.h"
#include "standby/sdk/engine_session_impl.h"

namespace baton {
namespace {

constexpr const char* kLog = "engine-sdk";
constexpr std::chrono::milliseconds kGrantHold{20};

}  // namespace

MappedExtent EngineSession::Impl::ExtentOf(uint32_t first, uint32_t count) const {
  return MappedExtent{.first = first,
                      .count = count,
                      .data = pool_.BlockData(first),
                      .bytes = uint64_t{count} * pool_.block_bytes()};
}

Result<std::vector<MappedExtent>> EngineSession::Impl::MapRangesLocked(
    const std::vector<proto::BlockRange>& ranges, std::vector<uint8_t>* inherited) {
  std::vector<MappedExtent> mapped;
  for (const proto::BlockRange& r : ranges) {
    Status status = MapBlocksLocked(r.first, r.count, inherited);
    if (!status.ok()) {
      for (const MappedExtent& m : mapped) (void)UnmapBlocksLocked(m.first, m.count);
      return status;
    }
    mapped.push_back(ExtentOf(r.first, r.count));
  }
  return mapped;
}

Status EngineSession::Impl::MapBlocksLocked(uint32_t first, uint32_t count,
                                            std::vector<uint8_t>* inherited) {
  BATON_RETURN_IF_ERROR(pool_.MapExtent(first, count));
  // Each header touched faults its page in: a long extent goes a slice at a time, with the
  // heartbeats that fall due between slices.
  constexpr uint32_t kSlice = 32;
  for (uint32_t at = first; at < first + count; at += kSlice) {
    const uint32_t n = std::min(kSlice, first + count - at);
    if (inherited != nullptr) pool_.CopyHeaders(at, n, kBlockHeaderBytes, inherited);
    pool_.ScrubHeaders(at, n, kBlockHeaderBytes);
    BeatIfDue();
  }
  if (device_ == nullptr) return OkStatus();
  Status mapped = device_->MapBlocks(first, count, pool_.block_bytes(), pool_.block_count(),
                                     kBlockHeaderBytes, std::chrono::seconds(10));
  if (!mapped.ok()) (void)pool_.UnmapExtent(first, count);
  return mapped;
}

Status EngineSession::Impl::UnmapBlocksLocked(uint32_t first, uint32_t count) {
  BATON_RETURN_IF_ERROR(pool_.UnmapExtent(first, count));
  return device_ == nullptr ? OkStatus() : device_->UnmapBlocks(first, count);
}

void EngineSession::Impl::OnPromote(const proto::Promote& msg) {
  const TimePoint start = clock_->Now();
  Result<std::vector<MappedExtent>> mapped = Unavailable("not mapped");
  SessionEvent event{.kind = SessionEventKind::kPromoted, .epoch = msg.epoch};
  TimePoint mapped_at = start;
  {
    MutexLock lock(mu_);
    if (promoted_ || msg.epoch == 0 || failed_.has_value()) {
      mapped = FailedPrecondition("Promote at epoch " + std::to_string(msg.epoch) +
                                  " refused: " + (promoted_ ? "already promoted" : "bad epoch"));
    } else {
      mapped = MapRangesLocked(msg.extents, &event.inherited_headers);
      mapped_at = clock_->Now();
      if (mapped.ok()) {
        promoted_ = true;
        epoch_.store(msg.epoch);
        ReadQuarantinedLocked(msg.epoch, &event);
      }
    }
  }
  if (!mapped.ok()) {
    (void)ReportError(mapped.status().WithContext("promotion"));
    return;
  }
  uint32_t blocks = 0;
  for (const MappedExtent& e : *mapped) blocks += e.count;
  uint32_t quarantined = 0;
  for (const MappedExtent& e : event.quarantined) quarantined += e.count;
  const TimePoint read_at = clock_->Now();
  std::ostringstream line;
  line << "promoted at epoch " << msg.epoch << ": " << blocks
       << " blocks mapped writable and scrubbed in " << MillisBetween(start, mapped_at) << " ms";
  if (quarantined > 0) {
    line << "; " << quarantined << " blocks of the old primary in quarantine (headers read in "
         << MillisBetween(mapped_at, read_at) << " ms, not mapped)";
  }
  BATON_LOG(INFO, kLog) << line.str();
  event.extents = std::move(mapped).value();
  Push(std::move(event));
}

void EngineSession::Impl::OnGrant(const proto::Grant& msg) {
  Result<std::vector<MappedExtent>> mapped = Unavailable("not mapped");
  std::vector<uint8_t> inherited;
  {
    MutexLock lock(mu_);
    // A Grant right behind the Promote (the old primary's blocks, their barrier passed while
    // the engine is still being promoted) waits until the engine serves, or waits for these
    // blocks, at most kGrantHold: mapping them holds mu_ for as long as their pages take to
    // fault in, and the engine's promotion takes mu_ on its way to serving.
    const auto until = std::chrono::steady_clock::now() + kGrantHold;
    while (promoted_ && !serving_ && !inherit_waiting_ && !stopped_.has_value() &&
           cv_.WaitUntil(mu_, until) != std::cv_status::timeout) {
    }
    if (!promoted_ || msg.epoch != epoch_.load()) {
      mapped =
          FailedPrecondition("Grant at epoch " + std::to_string(msg.epoch) +
                             " refused: this engine holds epoch " + std::to_string(epoch_.load()));
    } else {
      // Quarantined blocks come with the dead engine's headers (a loop: mu_ is held here).
      bool inherits = false;
      for (const auto& r : msg.extents) {
        for (const proto::BlockRange& q : quarantined_ranges_) {
          inherits |= r.count > 0 && r.first >= q.first && r.first - q.first < q.count;
        }
      }
      mapped = MapRangesLocked(msg.extents, inherits ? &inherited : nullptr);
    }
  }
  if (!mapped.ok()) {
    Refuse(mapped.status());
    return;
  }
  Push(SessionEvent{.kind = SessionEventKind::kGranted,
                    .epoch = msg.epoch,
                    .extents = std::move(mapped).value(),
                    .inherited_headers = std::move(inherited)});
}

}  // namespace baton
