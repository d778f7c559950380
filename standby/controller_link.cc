#include "standby/controller_link.h"

#include <algorithm>
#include <chrono>
#include <future>
#include <thread>

#include "base/log.h"

namespace baton {
namespace {

constexpr Duration kPollInterval = std::chrono::milliseconds(50);

}  // namespace

Result<std::unique_ptr<SessionModelMemory>> SessionModelMemory::Create(EngineSession* session,
                                                                       const LlamaConfig& config) {
  std::unique_ptr<SessionModelMemory> m(new SessionModelMemory(session, config));
  for (const MappedTensor& t : session->weights().tensors) {
    BATON_RETURN_IF_ERROR(m->weights_.Add(t.name, {t.dtype, t.shape, t.data, t.size}));
  }
  return m;
}

Result<KvLayout> SessionModelMemory::KvLayoutFor(const LlamaModel& model) const {
  const uint64_t block_bytes = session_->pool().block_bytes;
  if (block_bytes <= kBlockHeaderBytes) {
    return InvalidArgument("pool blocks of " + std::to_string(block_bytes) +
                           " bytes leave no room after the block header");
  }
  return model.KvLayoutForBlockBytes(block_bytes - kBlockHeaderBytes);
}

Status SessionModelMemory::AddKvBlocks(PagedKvCache* cache) {
  const std::vector<MappedExtent> extents = session_->extents();
  return AddExtents(cache, extents);
}

Status SessionModelMemory::AddExtents(PagedKvCache* cache, std::span<const MappedExtent> extents) {
  const PoolView& pool = session_->pool();
  for (const MappedExtent& e : extents) {
    for (uint32_t b = e.first; b < e.first + e.count; ++b) {
      if (added_.count(b) > 0) continue;
      BATON_RETURN_IF_ERROR(cache->AddBlock(b, pool.BlockData(b) + kBlockHeaderBytes,
                                            pool.block_bytes - kBlockHeaderBytes));
      added_.insert(b);
    }
  }
  return OkStatus();
}

std::vector<uint32_t> SessionModelMemory::TakeWhole(PagedKvCache* cache, uint32_t first,
                                                    uint32_t end) {
  for (uint32_t b = first; b < end; ++b) {
    if (added_.count(b) == 0) return {};
  }
  std::vector<uint32_t> taken;
  for (uint32_t b = first; b < end; ++b) {
    if (cache->RemoveBlock(b).ok()) {
      taken.push_back(b);
      continue;
    }
    // A sequence holds this one: the range stays whole in the cache.
    const PoolView& pool = session_->pool();
    for (uint32_t t : taken) {
      (void)cache->AddBlock(t, pool.BlockData(t) + kBlockHeaderBytes,
                            pool.block_bytes - kBlockHeaderBytes);
    }
    return {};
  }
  for (uint32_t b : taken) added_.erase(b);
  return taken;
}

std::vector<MappedExtent> SessionModelMemory::TakeFreeBlocks(PagedKvCache* cache, uint32_t blocks) {
  std::vector<uint32_t> taken;
  (void)TakeWholeChunks(session_->pool().block_count, session_->reclaim_chunk_blocks(), blocks,
                        [&](uint32_t first, uint32_t end) {
                          const std::vector<uint32_t> chunk = TakeWhole(cache, first, end);
                          taken.insert(taken.end(), chunk.begin(), chunk.end());
                          return !chunk.empty();
                        });
  std::sort(taken.begin(), taken.end());
  std::vector<MappedExtent> extents;
  const PoolView& pool = session_->pool();
  for (uint32_t b : taken) {
    if (!extents.empty() && extents.back().first + extents.back().count == b) {
      ++extents.back().count;
      extents.back().bytes += pool.block_bytes;
    } else {
      extents.push_back({b, 1, pool.BlockData(b), pool.block_bytes});
    }
  }
  return extents;
}

Status ControllerLink::Pump(const std::atomic<bool>& stop_requested) {
  while (!stop_requested.load()) {
    std::optional<SessionEvent> event = session_->NextEvent(kPollInterval);
    if (!event) continue;
    BATON_LOG(INFO, "engine") << "controller event: " << ToString(event->kind);
    switch (event->kind) {
      case SessionEventKind::kPromoted:
      case SessionEventKind::kGranted:
        OnGranted(*event);
        break;
      case SessionEventKind::kReclaim:
        OnReclaim(event->blocks);
        break;
      case SessionEventKind::kDrain:
        OnDrain(event->timeout, stop_requested);
        break;
      case SessionEventKind::kResume:
        api_->SetState(ServeState::kServing);
        BATON_LOG(INFO, "engine") << "the drain was called off: serving again";
        break;
      case SessionEventKind::kStop:
        BATON_LOG(INFO, "engine") << "the controller asked this engine to stop: " << event->reason;
        return OkStatus();
      case SessionEventKind::kDisconnected:
        return Unavailable("the session with the controller ended: " + event->reason);
      case SessionEventKind::kControllerLost:
        BATON_LOG(WARN, "engine") << "the controller is away (" << event->reason
                                  << "): serving on at epoch " << session_->epoch()
                                  << " while the SDK reconnects";
        break;
      case SessionEventKind::kControllerBack:
        BATON_LOG(INFO, "engine") << "the controller is back: " << event->reason;
        break;
    }
  }
  return OkStatus();
}

void ControllerLink::OnGranted(const SessionEvent& event) {
  auto extents = std::make_shared<std::vector<MappedExtent>>(event.extents);
  loop_->RunOnLoop([this, extents] {
    Status s = memory_->AddExtents(cache_, *extents);
    if (!s.ok()) {
      BATON_LOG(ERROR, "engine") << "granted blocks not added: " << s.ToString();
    }
    BATON_LOG(INFO, "engine") << "kv cache now holds " << cache_->total_blocks() << " blocks";
  });
}

void ControllerLink::OnReclaim(uint32_t blocks) {
  auto done = std::make_shared<std::promise<std::vector<MappedExtent>>>();
  std::future<std::vector<MappedExtent>> taken = done->get_future();
  if (!loop_->RunOnLoop(
          [this, blocks, done] { done->set_value(memory_->TakeFreeBlocks(cache_, blocks)); })) {
    return;
  }
  const std::vector<MappedExtent> extents = taken.get();
  uint32_t count = 0;
  for (const MappedExtent& e : extents) count += e.count;
  Status s = session_->ReturnBlocks(extents);
  BATON_LOG(INFO, "engine") << "reclaim of " << blocks << " blocks: returned " << count
                            << (s.ok() ? "" : " (failed: " + s.ToString() + ")");
}

void ControllerLink::OnDrain(Duration timeout, const std::atomic<bool>& stop_requested) {
  api_->SetState(ServeState::kStopping);
  const TimePoint deadline = clock_.Now() + timeout;
  while (loop_->pending() > 0 && clock_.Now() < deadline && !stop_requested.load() &&
         !session_->resume_pending()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const auto unfinished = static_cast<uint32_t>(loop_->pending());
  Status s = session_->ReportDrained(unfinished);
  BATON_LOG(INFO, "engine") << "drained with " << unfinished << " requests unfinished"
                            << (s.ok() ? "" : " (report failed: " + s.ToString() + ")");
}

}  // namespace baton
