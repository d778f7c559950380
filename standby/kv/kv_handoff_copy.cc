// KvHandoff: KV-warm failover before the predecessor's barrier (kv_handoff.h). The
// predecessor's blocks are quarantined and mapped read-only here; a write of its dying process
// (or of its GPU work) may still land in them while they are read. A sequence is kept only if
// its records were whole commits when they were planned, every block was copied whole into a
// block of this engine's, and afterwards every source record is still the planned one and
// every copied record checks (docs/architecture.md, fencing rule 6): a writer frees a block
// only after clearing its record and commits a record only after the K and V it claims, so a
// record unchanged across the copy vouches for the data copied under it.
#include <algorithm>
#include <atomic>
#include <cstring>

#include "base/log.h"
#include "standby/kv/kv_handoff.h"

namespace baton {

KvCopyPlan KvHandoff::PlanCopy(std::span<const KvBlockRun> runs,
                               std::span<const uint8_t> headers) const {
  KvCopyPlan plan;
  const std::vector<bool> quarantined = BlocksOf(runs);
  std::map<KvRequestKey, Chain> chains = ReadChains(runs, headers);
  for (auto& [key, chain] : chains) {
    const std::string reason = chain.bad.empty() ? Refusal(&chain, quarantined) : chain.bad;
    if (!reason.empty()) {
      ++plan.dropped[reason];
      continue;
    }
    KvCopyPlan::Sequence s{.key = key, .records = std::move(chain.records), .headers = {}};
    for (const KvRecordRead& r : s.records) {
      const uint8_t* header = options_.block(r.record.block);
      s.headers.insert(s.headers.end(), header, header + kKvRecordHeaderBytes);
    }
    plan.blocks += static_cast<uint32_t>(s.records.size());
    plan.sequences.push_back(std::move(s));
  }
  plan.bytes = uint64_t{plan.blocks} * options_.block_bytes;
  return plan;
}

bool KvHandoff::CopyHolds(const KvCopyPlan::Sequence& s, const std::vector<uint32_t>& dst) const {
  for (size_t i = 0; i < s.records.size(); ++i) {
    const KvBlockRecord& planned = s.records[i].record;
    const uint8_t* source = options_.block(planned.block);
    if (std::memcmp(source, s.headers.data() + i * kKvRecordHeaderBytes, kKvRecordHeaderBytes) !=
        0) {
      return false;  // the writer moved on: the data copied may be of another commit
    }
    const uint8_t* copy = options_.block(dst[i]);
    const KvRecordRead read =
        ReadKvRecord(copy, copy + kKvRecordHeaderBytes, options_.block_tokens);
    if (read.state != KvRecordState::kValid || read.record.key != planned.key ||
        read.record.block != planned.block || read.record.index != planned.index ||
        read.record.tokens != planned.tokens || read.record.writer_epoch != planned.writer_epoch ||
        read.ids != s.records[i].ids) {
      return false;
    }
  }
  return true;
}

KvAdoptionReport KvHandoff::CopyIn(const KvCopyPlan& plan,
                                   const std::function<Result<uint32_t>()>& take,
                                   const std::function<void()>& between,
                                   std::vector<std::pair<uint32_t, uint32_t>>* kept_blocks) {
  const TimePoint start = options_.clock->Now();
  KvAdoptionReport report;
  for (const KvCopyPlan::Sequence& s : plan.sequences) {
    Kept kept;
    std::string reason;
    for (const KvRecordRead& r : s.records) {
      Result<uint32_t> dst = take();
      if (!dst.ok()) {
        reason = "hold_failed";
        break;
      }
      std::memcpy(options_.block(*dst), options_.block(r.record.block), options_.block_bytes);
      kept.kv.blocks.push_back(*dst);
      kept.kv.length += r.record.tokens;
      kept.tokens.insert(kept.tokens.end(), r.ids.begin(), r.ids.end());
    }
    if (between) between();
    // The source headers are read again only after every byte of the copy.
    std::atomic_thread_fence(std::memory_order_acquire);
    if (reason.empty() && !CopyHolds(s, kept.kv.blocks)) reason = "changed";
    if (!reason.empty()) {
      if (!kept.kv.blocks.empty()) Free(&kept.kv);
      ++report.dropped[reason];
      BATON_LOG(INFO, "kv") << "not copying request " << s.key.ToHex() << ": " << reason;
      continue;
    }
    if (kept_blocks != nullptr) {
      for (size_t i = 0; i < s.records.size(); ++i) {
        kept_blocks->emplace_back(s.records[i].record.block, kept.kv.blocks[i]);
      }
    }
    Keep(s.key, std::move(kept), &report);
  }
  for (const auto& [reason, n] : plan.dropped) report.dropped[reason] += n;
  report.ms = MillisBetween(start, options_.clock->Now());
  if (options_.metrics != nullptr) options_.metrics->AddKvAdoption(report.adopted, report.dropped);
  UpdateGauge();
  return report;
}

}  // namespace baton
