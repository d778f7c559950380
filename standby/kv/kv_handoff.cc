#include "standby/kv/kv_handoff.h"

#include <algorithm>
#include <sstream>

#include "base/log.h"

namespace baton {

uint32_t KvAdoptionReport::dropped_total() const {
  uint32_t n = 0;
  for (const auto& [reason, count] : dropped) n += count;
  return n;
}

std::string KvAdoptionReport::Summary() const {
  std::ostringstream out;
  out << "adopted " << adopted << " sequences (" << tokens << " tokens), dropped "
      << dropped_total();
  if (!dropped.empty()) {
    out << " (";
    const char* sep = "";
    for (const auto& [reason, count] : dropped) {
      out << sep << reason << " " << count;
      sep = ", ";
    }
    out << ")";
  }
  out << " in " << ms << " ms";
  return out.str();
}

KvHandoff::KvHandoff(PagedKvCache* cache, KvHandoffOptions options)
    : cache_(cache), options_(std::move(options)) {
  if (options_.clock == nullptr) options_.clock = &RealClock::Get();
}

void KvHandoff::CommitBlocks(const KvRequestKey& key, const KvSequence& kv,
                             std::span<const int32_t> tokens, size_t first_index,
                             size_t last_index) {
  const auto bt = static_cast<int64_t>(options_.block_tokens);
  const uint64_t epoch = options_.epoch ? options_.epoch() : 0;
  for (size_t i = first_index; i <= last_index && i < kv.blocks.size(); ++i) {
    const int64_t start = static_cast<int64_t>(i) * bt;
    const int64_t count = std::min(bt, kv.length - start);
    if (count <= 0) break;
    const KvBlockRecord record{.identity = options_.identity,
                               .key = key,
                               .writer_epoch = epoch,
                               .block = kv.blocks[i],
                               .prev_block = i == 0 ? kKvNoBlock : kv.blocks[i - 1],
                               .index = static_cast<uint32_t>(i),
                               .tokens = static_cast<uint32_t>(count)};
    CommitKvRecord(options_.block(kv.blocks[i]), record, tokens.subspan(start, count));
  }
}

void KvHandoff::Committed(const GenerationRequest& request, const KvSequence& kv,
                          std::span<const int32_t> tokens, int64_t before) {
  if (request.key.empty() || kv.length <= before || kv.length > std::ssize(tokens)) return;
  const auto bt = static_cast<int64_t>(options_.block_tokens);
  CommitBlocks(request.key, kv, tokens, static_cast<size_t>(before / bt),
               static_cast<size_t>((kv.length - 1) / bt));
}

void KvHandoff::Releasing(const KvSequence& kv) {
  for (KvBlockId b : kv.blocks) ClearKvRecord(options_.block(b));
}

void KvHandoff::Free(KvSequence* kv) {
  Releasing(*kv);
  cache_->Release(kv);
}

void KvHandoff::FreeKept(std::map<KvRequestKey, Kept>::iterator it, const char* reason) {
  BATON_LOG(DEBUG, "kv") << "freed the kept kv of request " << it->first.ToHex() << " (" << reason
                         << ")";
  Free(&it->second.kv);
  kept_.erase(it);
  if (options_.metrics != nullptr) options_.metrics->CountKvKeptFreed(reason);
  UpdateGauge();
}

void KvHandoff::UpdateGauge() const {
  if (options_.metrics != nullptr) options_.metrics->SetKvKept(kept_.size());
}

std::string KvHandoff::Refusal(Chain* chain, const std::vector<bool>& granted) const {
  auto& records = chain->records;
  std::sort(records.begin(), records.end(), [](const KvRecordRead& a, const KvRecordRead& b) {
    return a.record.index < b.record.index;
  });
  auto not_granted = [&](uint32_t block) {
    return block != kKvNoBlock && (block >= granted.size() || !granted[block]);
  };
  for (size_t i = 0; i < records.size(); ++i) {
    const KvBlockRecord& r = records[i].record;
    if (r.index < i) return "corrupt";  // two blocks at one index
    const uint32_t expected_prev = i == 0 ? kKvNoBlock : records[i - 1].record.block;
    if (r.index > i || r.prev_block != expected_prev) {
      if (not_granted(r.prev_block)) return "not_granted";
      return r.index > i ? "incomplete" : "corrupt";
    }
    if (i + 1 < records.size() && r.tokens != static_cast<uint32_t>(options_.block_tokens)) {
      return "incomplete";
    }
  }
  return "";
}

std::map<KvRequestKey, KvHandoff::Chain> KvHandoff::ReadChains(
    std::span<const KvBlockRun> runs, std::span<const uint8_t> headers) const {
  const uint64_t epoch = options_.epoch ? options_.epoch() : 0;
  std::map<KvRequestKey, Chain> chains;
  size_t at = 0;
  for (const KvBlockRun& run : runs) {
    for (uint32_t b = run.first; b < run.first + run.count; ++b, at += kKvRecordHeaderBytes) {
      if (at + kKvRecordHeaderBytes > headers.size()) break;
      KvRecordRead read = ReadKvRecord(
          headers.data() + at, options_.block(b) + kKvRecordHeaderBytes, options_.block_tokens);
      if (read.state == KvRecordState::kAbsent) continue;
      Chain& chain = chains[read.record.key];
      std::string bad;
      if (read.state != KvRecordState::kValid) {
        bad = ToString(read.state);
      } else if (read.record.block != b) {
        bad = "corrupt";
      } else if (read.record.identity != options_.identity) {
        bad = "identity";
      } else if (read.record.writer_epoch >= epoch) {
        bad = "epoch";
      }
      if (chain.bad.empty()) chain.bad = bad;
      chain.records.push_back(std::move(read));
    }
  }
  return chains;
}

std::vector<bool> KvHandoff::BlocksOf(std::span<const KvBlockRun> runs) {
  std::vector<bool> granted;
  for (const KvBlockRun& run : runs) {
    granted.resize(std::max<size_t>(granted.size(), size_t{run.first} + run.count), false);
    for (uint32_t b = run.first; b < run.first + run.count; ++b) granted[b] = true;
  }
  return granted;
}

KvAdoptionReport KvHandoff::Adopt(std::span<const KvBlockRun> runs,
                                  std::span<const uint8_t> headers,
                                  const std::function<Status(uint32_t block)>& hold) {
  const TimePoint start = options_.clock->Now();
  const std::vector<bool> granted = BlocksOf(runs);
  std::map<KvRequestKey, Chain> chains = ReadChains(runs, headers);
  KvAdoptionReport report;
  for (auto& [key, chain] : chains) {
    std::string reason = chain.bad.empty() ? Refusal(&chain, granted) : chain.bad;
    Kept kept;
    for (size_t i = 0; reason.empty() && i < chain.records.size(); ++i) {
      const KvRecordRead& r = chain.records[i];
      if (!hold(r.record.block).ok()) {
        reason = "hold_failed";
        break;
      }
      kept.kv.blocks.push_back(r.record.block);
      kept.kv.length += r.record.tokens;
      kept.tokens.insert(kept.tokens.end(), r.ids.begin(), r.ids.end());
    }
    if (!reason.empty()) {
      if (!kept.kv.blocks.empty()) Free(&kept.kv);
      ++report.dropped[reason];
      BATON_LOG(INFO, "kv") << "not adopting request " << key.ToHex() << ": " << reason;
      continue;
    }
    Keep(key, std::move(kept), &report);
  }
  report.ms = MillisBetween(start, options_.clock->Now());
  if (options_.metrics != nullptr) options_.metrics->AddKvAdoption(report.adopted, report.dropped);
  UpdateGauge();
  return report;
}

void KvHandoff::Keep(const KvRequestKey& key, Kept kept, KvAdoptionReport* report) {
  // One request's KV found twice (an old record in a promoted block, the newer one in the
  // predecessor's): the longer is kept.
  if (auto it = kept_.find(key); it != kept_.end()) {
    if (it->second.kv.length >= kept.kv.length) {
      Free(&kept.kv);
      ++report->dropped["duplicate"];
      return;
    }
    FreeKept(it, "replaced");
  }
  CommitBlocks(key, kept.kv, kept.tokens, 0, kept.kv.blocks.size() - 1);
  kept.since = options_.clock->Now();
  ++report->adopted;
  report->tokens += static_cast<uint64_t>(kept.kv.length);
  kept_[key] = std::move(kept);
}

int64_t KvHandoff::Continue(const GenerationRequest& request, std::span<const int32_t> tokens,
                            KvSequence* kv) {
  auto it = kept_.find(request.key);
  if (it == kept_.end() || tokens.empty()) return 0;
  Kept& kept = it->second;
  const size_t limit = std::min(kept.tokens.size(), tokens.size() - 1);
  const auto same = std::mismatch(kept.tokens.begin(), kept.tokens.begin() + limit, tokens.begin());
  const auto use = static_cast<int64_t>(same.first - kept.tokens.begin());
  if (use == 0) {
    FreeKept(it, "mismatch");
    return 0;
  }
  const auto blocks = static_cast<size_t>(cache_->BlocksFor(use));
  KvSequence rest;
  rest.blocks.assign(kept.kv.blocks.begin() + static_cast<std::ptrdiff_t>(blocks),
                     kept.kv.blocks.end());
  if (!rest.blocks.empty()) Free(&rest);
  kv->blocks.assign(kept.kv.blocks.begin(),
                    kept.kv.blocks.begin() + static_cast<std::ptrdiff_t>(blocks));
  kv->length = use;
  CommitBlocks(request.key, *kv, tokens, blocks - 1, blocks - 1);  // the record never claims more
  kept_.erase(it);
  if (options_.metrics != nullptr) options_.metrics->AddKvContinued(use);
  UpdateGauge();
  BATON_LOG(DEBUG, "kv") << "request " << request.key.ToHex() << " continues from " << use
                         << " kept tokens of " << tokens.size();
  return use;
}

void KvHandoff::Evict(size_t blocks) {
  size_t freed = 0;
  while (freed < blocks && !kept_.empty()) {
    auto oldest = std::min_element(kept_.begin(), kept_.end(), [](const auto& a, const auto& b) {
      return a.second.since < b.second.since;
    });
    freed += oldest->second.kv.blocks.size();
    FreeKept(oldest, "evicted");
  }
}

size_t KvHandoff::Expire() {
  const TimePoint now = options_.clock->Now();
  size_t n = 0;
  for (auto it = kept_.begin(); it != kept_.end();) {
    auto next = std::next(it);
    if (now - it->second.since >= options_.keep_for) {
      FreeKept(it, "expired");
      ++n;
    }
    it = next;
  }
  return n;
}

void KvHandoff::Park(const GenerationRequest& request, KvSequence* kv,
                     std::span<const int32_t> tokens) {
  if (request.key.empty() || kv->length <= 0) return;
  if (auto it = kept_.find(request.key); it != kept_.end()) FreeKept(it, "replaced");
  Kept kept;
  kept.kv = std::move(*kv);
  kept.tokens.assign(tokens.begin(), tokens.begin() + kept.kv.length);
  kept.since = options_.clock->Now();
  *kv = KvSequence{};
  kept_[request.key] = std::move(kept);
  if (options_.metrics != nullptr) options_.metrics->AddKvHandedOver(1);
  UpdateGauge();
}

}  // namespace baton
