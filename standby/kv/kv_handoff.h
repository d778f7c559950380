// KvHandoff: the reference engine's KV-warm failover (docs/architecture.md, "KV-warm
// failover"). It is the Generator's KvHooks over the pool blocks of one engine:
//
//  * as a writer, it commits a record (kv_record.h) into every block a keyed sequence filled
//    in a step, after the step's K and V are written, and clears a block's record before the
//    block is freed, so that a free block never carries one;
//  * as a successor, Adopt() reads the records of the blocks inherited with a promotion (the
//    header copies the SDK took before its scrub, the token ids from the blocks) and keeps
//    every sequence whose records are complete, valid and of this engine's identity; anything
//    in doubt is dropped, counted by reason, and its blocks are free like any other;
//  * as a successor promoted before its predecessor's barrier, PlanCopy() reads the records of
//    the predecessor's quarantined blocks (mapped read-only: a write of the dying engine may
//    still land in them) and CopyIn() copies the sequences that pass into blocks of its own,
//    then reads every source record again and checks every copied one: a sequence whose
//    record changed meanwhile, or whose copy does not check, is dropped ("changed"), so what is
//    kept is a whole commit that was in place before and after its data was copied;
//  * a request that comes back with the same key (the router's replay) continues from the
//    kept KV of the longest prefix of its tokens that the KV holds (Continue), so only the
//    rest is prefilled; a kept sequence nobody claims within keep_for, or whose blocks the
//    cache needs, is freed;
//  * a planned switch-over parks the running sequences (Park): their records stay, so the
//    next primary adopts them, or this engine takes them back if the switch-over is called off.
//
// Refusal rules of Adopt and PlanCopy (reasons as counted): "torn" (a record of the sequence
// was being written), "corrupt" (a checksum or a field does not hold), "identity" (another
// model, KV layout or block size), "epoch" (written at an epoch not below this engine's),
// "not_granted" (the chain names a block that is not in this engine's grant, or not in the
// quarantine), "incomplete" (a block of the chain is missing, or a block before the last is not
// full), "hold_failed" (the cache would not take a block), "duplicate" (the same request's KV
// is kept already, as long or longer: the longer of the two stays); and of CopyIn: "changed"
// (a source record changed while it was copied, or the copy does not check).
//
// Thread: the compute thread only (Adopt before the loop starts, or on it). The cache must
// outlive the handoff; kept blocks stay as they are when it is destroyed (their records are
// for a successor).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "base/clock.h"
#include "base/status.h"
#include "standby/engine_metrics.h"
#include "standby/kv/kv_record.h"
#include "standby/model/generator.h"
#include "standby/model/kv_hooks.h"
#include "standby/model/paged_kv.h"

namespace baton {

struct KvHandoffOptions {
  uint64_t identity = 0;  // KvIdentityOf(this engine's model, layout and format)
  int block_tokens = 0;   // the cache's layout().block_tokens
  // The pool block's memory (the record header at offset 0).
  std::function<uint8_t*(uint32_t block)> block;
  // This engine's epoch now (a record carries its writer's).
  std::function<uint64_t()> epoch;
  // A pool block's bytes (header, token ids and KV data): what CopyIn copies per block.
  uint64_t block_bytes = 0;
  Duration keep_for = std::chrono::seconds(30);
  const Clock* clock = nullptr;      // RealClock when null
  EngineMetrics* metrics = nullptr;  // optional
};

// A run of inherited blocks [first, first + count).
struct KvBlockRun {
  uint32_t first = 0;
  uint32_t count = 0;
};

struct KvAdoptionReport {
  uint32_t adopted = 0;                     // sequences kept
  uint64_t tokens = 0;                      // tokens whose K and V they hold
  std::map<std::string, uint32_t> dropped;  // reason -> sequences
  double ms = 0;
  uint32_t dropped_total() const;
  // "adopted 3 sequences (1200 tokens), dropped 1 (torn 1) in 0.2 ms"
  std::string Summary() const;
};

// The sequences of a predecessor's quarantined blocks that a copy would keep (PlanCopy).
struct KvCopyPlan {
  struct Sequence {
    KvRequestKey key;
    std::vector<KvRecordRead> records;  // in index order; record.block is the source block
    std::vector<uint8_t> headers;       // each source header as read (kKvRecordHeaderBytes)
  };
  std::vector<Sequence> sequences;
  std::map<std::string, uint32_t> dropped;  // reason -> sequences not worth a copy
  uint32_t blocks = 0;                      // source blocks of `sequences`
  uint64_t bytes = 0;                       // blocks x block_bytes: what CopyIn copies
};

class KvHandoff final : public KvHooks {
 public:
  KvHandoff(PagedKvCache* cache, KvHandoffOptions options);
  ~KvHandoff() override = default;
  KvHandoff(const KvHandoff&) = delete;
  KvHandoff& operator=(const KvHandoff&) = delete;

  // Reads the records of the inherited `runs` (in order; `headers` holds kKvRecordHeaderBytes
  // per block, in the same order, as SessionEvent::inherited_headers) and keeps the sequences
  // that pass. `hold(block)` adds a block of a kept sequence to the cache as held; the caller
  // adds the other blocks as free afterwards. Rewrites the kept records at this epoch.
  KvAdoptionReport Adopt(std::span<const KvBlockRun> runs, std::span<const uint8_t> headers,
                         const std::function<Status(uint32_t block)>& hold);

  // Reads the records of the predecessor's quarantined `runs` (`headers` as SessionEvent::
  // quarantined_headers; ids and data from options.block(b), the read-only view) and returns
  // the sequences that Adopt would keep, with the blocks a copy of them takes.
  KvCopyPlan PlanCopy(std::span<const KvBlockRun> runs, std::span<const uint8_t> headers) const;
  // Copies each planned sequence into blocks `take()` hands out (the engine's own, added to
  // the cache as held), block by block, whole; then, after `between` (tests: writes of the
  // dying engine), reads each source header again and each copied record, and keeps the
  // sequence only if every source header is as planned and every copy is a valid record of the
  // same commit. Kept records are rewritten at this epoch in their new blocks; blocks of a
  // dropped sequence go back to the cache free.
  // `kept`, when given, gets the (source, copy) blocks of every sequence kept.
  KvAdoptionReport CopyIn(const KvCopyPlan& plan, const std::function<Result<uint32_t>()>& take,
                          const std::function<void()>& between = nullptr,
                          std::vector<std::pair<uint32_t, uint32_t>>* kept = nullptr);

  // KvHooks.
  void Committed(const GenerationRequest& request, const KvSequence& kv,
                 std::span<const int32_t> tokens, int64_t before) override;
  void Releasing(const KvSequence& kv) override;
  int64_t Continue(const GenerationRequest& request, std::span<const int32_t> tokens,
                   KvSequence* kv) override;
  void Evict(size_t blocks) override;
  void Park(const GenerationRequest& request, KvSequence* kv,
            std::span<const int32_t> tokens) override;

  // Frees the kept sequences older than keep_for; returns how many.
  size_t Expire();
  size_t kept() const { return kept_.size(); }

 private:
  struct Kept {
    KvSequence kv;
    std::vector<int32_t> tokens;  // the ids whose K and V it holds
    TimePoint since;
  };
  // One request's records as read, with the first reason found against them.
  struct Chain {
    std::vector<KvRecordRead> records;
    std::string bad;
  };

  // The records of `runs` by request key (headers from `headers`, ids from the blocks), each
  // chain with the first reason found against it while reading.
  std::map<KvRequestKey, Chain> ReadChains(std::span<const KvBlockRun> runs,
                                           std::span<const uint8_t> headers) const;
  // Which blocks `runs` cover, by block number.
  static std::vector<bool> BlocksOf(std::span<const KvBlockRun> runs);
  // Whether the copy of planned sequence `s` in `dst` still is the commit it was planned from.
  bool CopyHolds(const KvCopyPlan::Sequence& s, const std::vector<uint32_t>& dst) const;
  // Writes the records of blocks [first_index, last_index] of `kv`.
  void CommitBlocks(const KvRequestKey& key, const KvSequence& kv, std::span<const int32_t> tokens,
                    size_t first_index, size_t last_index);
  // Why the chain cannot be adopted, or "" when it can.
  std::string Refusal(Chain* chain, const std::vector<bool>& granted) const;
  // Keeps an adopted or copied sequence: its records rewritten at this epoch, counted.
  void Keep(const KvRequestKey& key, Kept kept, KvAdoptionReport* report);
  void Free(KvSequence* kv);
  void FreeKept(std::map<KvRequestKey, Kept>::iterator it, const char* reason);
  void UpdateGauge() const;

  PagedKvCache* cache_;
  KvHandoffOptions options_;
  std::map<KvRequestKey, Kept> kept_;
};

}  // namespace baton
