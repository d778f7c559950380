#include "standby/controller_link.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>
#include <sstream>
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
  static_assert(kKvRecordHeaderBytes == kBlockHeaderBytes);
  const uint64_t block_bytes = session_->pool().block_bytes;
  const uint64_t per_token = model.MakeKvLayout(1).block_bytes();
  const int tokens = KvBlockTokensFor(block_bytes, per_token);
  if (tokens < 1) {
    return InvalidArgument("pool blocks of " + std::to_string(block_bytes) +
                           " bytes hold no token after the block header and token ids; one "
                           "token needs " +
                           std::to_string(per_token + sizeof(int32_t)) + " bytes");
  }
  return model.MakeKvLayout(tokens);
}

Status SessionModelMemory::AddTo(PagedKvCache* cache, uint32_t block, bool held) {
  const PoolView& pool = session_->pool();
  const uint64_t offset = KvDataOffset(cache->layout().block_tokens);
  uint8_t* data = pool.BlockData(block) + offset;
  const uint64_t bytes = pool.block_bytes - offset;
  BATON_RETURN_IF_ERROR(held ? cache->AddHeldBlock(block, data, bytes)
                             : cache->AddBlock(block, data, bytes));
  added_.insert(block);
  return OkStatus();
}

Status SessionModelMemory::AddHeldBlock(PagedKvCache* cache, uint32_t block) {
  if (added_.count(block) > 0) {
    return FailedPrecondition("block " + std::to_string(block) + " is already in the cache");
  }
  return AddTo(cache, block, /*held=*/true);
}

Status SessionModelMemory::AddKvBlocks(PagedKvCache* cache) {
  const std::vector<MappedExtent> extents = session_->extents();
  return AddExtents(cache, extents);
}

Status SessionModelMemory::AddExtents(PagedKvCache* cache, std::span<const MappedExtent> extents) {
  for (const MappedExtent& e : extents) {
    for (uint32_t b = e.first; b < e.first + e.count; ++b) {
      if (added_.count(b) == 0) BATON_RETURN_IF_ERROR(AddTo(cache, b, /*held=*/false));
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
    for (uint32_t t : taken) {
      added_.erase(t);
      (void)AddTo(cache, t, /*held=*/false);
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

uint64_t KvIdentityFor(std::string_view format, const EngineSession& session,
                       const LlamaConfig& config, const KvLayout& layout) {
  std::ostringstream d;
  d << format << "|model=" << session.weights().model << "|layers=" << layout.layers
    << "|kv_heads=" << layout.kv_heads << "|head_dim=" << layout.head_dim
    << "|block_tokens=" << layout.block_tokens << "|block_bytes=" << session.pool().block_bytes
    << "|data_offset=" << KvDataOffset(layout.block_tokens) << "|hidden=" << config.hidden_size
    << "|heads=" << config.num_attention_heads << "|rope_theta=" << config.rope_theta
    << "|rope_scaling=" << static_cast<int>(config.rope_scaling.type) << ","
    << config.rope_scaling.factor << "|eps=" << config.rms_norm_eps;
  for (const MappedTensor& t : session.weights().tensors) {
    d << "|" << t.name << ":" << static_cast<int>(t.dtype) << ":" << t.size;
  }
  return KvIdentityOf(d.str());
}

namespace {

void Merge(const KvAdoptionReport& more, KvAdoptionReport* report) {
  report->adopted += more.adopted;
  report->tokens += more.tokens;
  for (const auto& [reason, n] : more.dropped) report->dropped[reason] += n;
  report->ms += more.ms;
}

std::vector<KvBlockRun> RunsOf(std::span<const MappedExtent> extents) {
  std::vector<KvBlockRun> runs;
  for (const MappedExtent& e : extents) runs.push_back({e.first, e.count});
  return runs;
}

// The quarantined blocks, granted once past their barrier (within the wait limit), adopted
// in place; their KV is replayed if they do not come.
void AdoptOnceGranted(const SessionEvent& promoted, EngineSession* session,
                      SessionModelMemory* memory, PagedKvCache* cache, KvHandoff* handoff,
                      KvAdoptionReport* report) {
  Result<SessionEvent> granted = session->WaitForInheritedBlocks(promoted.wait_limit);
  if (!granted.ok()) {
    BATON_LOG(WARN, "kv") << "the quarantined blocks' kv is replayed: "
                          << granted.status().ToString();
    return;
  }
  Merge(handoff->Adopt(RunsOf(granted->extents), granted->inherited_headers,
                       [&](uint32_t block) { return memory->AddHeldBlock(cache, block); }),
        report);
  if (Status added = memory->AddExtents(cache, granted->extents); !added.ok()) {
    BATON_LOG(WARN, "kv") << "inherited blocks not added: " << added.ToString();
  }
}

// The blocks of `readable` whose header copies (promoted.quarantined_headers, in extent
// order) name a KV record.
std::vector<uint32_t> BlocksWithRecords(std::span<const MappedExtent> readable,
                                        const SessionEvent& promoted) {
  std::vector<uint32_t> blocks;
  size_t at = 0;
  for (const MappedExtent& e : readable) {
    for (uint32_t b = e.first; b < e.first + e.count; ++b, at += kBlockHeaderBytes) {
      if (KvRecordPresent(promoted.quarantined_headers.data() + at)) blocks.push_back(b);
    }
  }
  return blocks;
}

// The sequences a copy dropped that are adopted in place once granted (within the wait
// limit) rather than replayed, taken out of `copied`: a source record changed under the copy
// (the dying writer, or the Grant of these blocks scrubbing their headers: their barrier passed
// while the copy ran), or no promoted block was left to copy into.
uint32_t TakeNotCopied(KvAdoptionReport* copied) {
  uint32_t n = 0;
  for (const char* reason : {"changed", "hold_failed"}) {
    if (auto it = copied->dropped.find(reason); it != copied->dropped.end()) {
      n += it->second;
      copied->dropped.erase(it);
    }
  }
  return n;
}

// The quarantined blocks' committed KV: copied now, or adopted in place after the barrier.
void InheritQuarantined(const SessionEvent& promoted, EngineSession* session,
                        SessionModelMemory* memory, PagedKvCache* cache, KvHandoff* handoff,
                        double copy_gbps, KvAdoptionReport* report) {
  const TimePoint start = RealClock::Get().Now();
  // The SDK read the headers of the quarantined blocks from the host pool (on a device pool
  // too), in extent order, and mapped nothing of them.
  uint64_t quarantined_blocks = 0;
  for (const MappedExtent& e : promoted.quarantined) quarantined_blocks += e.count;
  std::vector<MappedExtent> readable;
  if (promoted.quarantined_headers.size() == quarantined_blocks * kBlockHeaderBytes) {
    readable = promoted.quarantined;
  }
  // Reading a record takes its block's token ids: those blocks alone are mapped, read-only.
  // Refused when their barrier passed meanwhile and their Grant mapped them writable (the SDK
  // kept their headers): they are adopted in place, as if waited for. (This engine computes
  // on the host: its pool is never a device pool.)
  const Status read = session->MapQuarantined(BlocksWithRecords(readable, promoted));
  if (!read.ok()) {
    BATON_LOG(WARN, "kv") << "the quarantined blocks' kv is not read (" << read.ToString()
                          << "): adopted in place once granted";
    readable.clear();
  }
  const KvCopyPlan plan = handoff->PlanCopy(RunsOf(readable), promoted.quarantined_headers);
  KvInheritanceSummary summary{.mode = KvInheritMode::kNone,
                               .blocks = plan.blocks,
                               .bytes = plan.bytes,
                               .ms = 0,
                               .estimate_ms = copy_gbps > 0 ? plan.bytes / (copy_gbps * 1e6) : 0};
  const double wait_ms =
      std::chrono::duration<double, std::milli>(promoted.barrier_estimate).count();
  if (read.ok() && (plan.sequences.empty() || summary.estimate_ms <= wait_ms)) {
    // Nothing to copy is a copy of nothing: what was dropped is still counted.
    if (!plan.sequences.empty()) summary.mode = KvInheritMode::kCopied;
    std::vector<uint32_t> own;
    for (const MappedExtent& e : promoted.extents) {
      for (uint32_t b = e.first; b < e.first + e.count; ++b) {
        if (!memory->InCache(b)) own.push_back(b);
      }
    }
    size_t next = 0;
    auto take = [&]() -> Result<uint32_t> {
      if (next == own.size()) return ResourceExhausted("no promoted block left to copy into");
      const uint32_t b = own[next++];
      BATON_RETURN_IF_ERROR(memory->AddHeldBlock(cache, b));
      return b;
    };
    KvAdoptionReport copied = handoff->CopyIn(plan, take);
    if (const uint32_t not_copied = TakeNotCopied(&copied); not_copied > 0) {
      BATON_LOG(INFO, "kv") << not_copied << " sequences not copied (changed, or no block to "
                            << "copy into): waiting for the quarantined blocks to adopt them in "
                            << "place";
      Merge(copied, report);
      summary.mode = KvInheritMode::kWaited;
      AdoptOnceGranted(promoted, session, memory, cache, handoff, report);
    } else {
      Merge(copied, report);
    }
  } else {
    summary.mode = KvInheritMode::kWaited;
    AdoptOnceGranted(promoted, session, memory, cache, handoff, report);
  }
  session->ReleaseQuarantined();
  summary.ms = MillisBetween(start, RealClock::Get().Now());
  BATON_LOG(INFO, "kv") << "epoch " << promoted.epoch << ": " << plan.blocks
                        << " quarantined blocks hold committed kv (" << plan.bytes << " bytes, a "
                        << summary.estimate_ms << " ms copy against a " << wait_ms
                        << " ms barrier): "
                        << (summary.mode == KvInheritMode::kCopied   ? "copied"
                            : summary.mode == KvInheritMode::kWaited ? "waited for the barrier"
                                                                     : "nothing to take")
                        << " in " << summary.ms << " ms";
  if (Status told = session->ReportKvInheritance(summary); !told.ok()) {
    BATON_LOG(WARN, "kv") << "inheritance not reported: " << told.ToString();
  }
}

}  // namespace

double MeasureCopyGbps() {
  constexpr size_t kBytes = 16u << 20;
  std::vector<uint8_t> from(kBytes, 1), to(kBytes, 0);
  double best = 0;
  for (int i = 0; i < 3; ++i) {
    const TimePoint start = RealClock::Get().Now();
    std::memcpy(to.data(), from.data(), kBytes);
    const double ms = MillisBetween(start, RealClock::Get().Now());
    if (ms > 0) best = std::max(best, kBytes / (ms * 1e6));
  }
  return best;
}

Result<KvAdoptionReport> AdoptPromotedBlocks(const SessionEvent& promoted, EngineSession* session,
                                             SessionModelMemory* memory, PagedKvCache* cache,
                                             KvHandoff* handoff, double copy_gbps) {
  KvAdoptionReport report;
  if (handoff != nullptr) {
    report = handoff->Adopt(RunsOf(promoted.extents), promoted.inherited_headers,
                            [&](uint32_t block) { return memory->AddHeldBlock(cache, block); });
    if (!promoted.quarantined.empty()) {
      InheritQuarantined(promoted, session, memory, cache, handoff, copy_gbps, &report);
    }
    BATON_LOG(INFO, "kv") << "epoch " << promoted.epoch << ": " << report.Summary();
  } else if (!promoted.quarantined.empty()) {
    session->ReleaseQuarantined();
  }
  BATON_RETURN_IF_ERROR(memory->AddExtents(cache, promoted.extents));
  if (handoff != nullptr) {
    Status told =
        session->ReportKvAdoption({report.adopted, report.tokens, report.dropped, report.ms});
    if (!told.ok()) BATON_LOG(WARN, "kv") << "adoption not reported: " << told.ToString();
  }
  return report;
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
        OnDrain(event->timeout, event->successor, stop_requested);
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

void ControllerLink::OnDrain(Duration timeout, bool successor,
                             const std::atomic<bool>& stop_requested) {
  api_->SetState(ServeState::kStopping);
  if (handoff_ != nullptr && successor) {
    // The next primary continues them from their KV: no need to wait for them to finish.
    const size_t handed = loop_->HandOver();
    BATON_LOG(INFO, "engine") << "handed " << handed << " keyed requests over to the next primary";
  } else if (!successor) {
    BATON_LOG(INFO, "engine") << "no next primary follows this drain: finishing "
                              << loop_->pending() << " requests";
  }
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
