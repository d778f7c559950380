// The reference engine under a Baton controller.
//
// SessionModelMemory is the ModelMemory of an engine whose weights are the controller's
// arena, mapped read-only by the EngineSession, and whose KV blocks are the pool blocks the
// controller granted: pool block b is KV block b, laid out as kv/kv_record.h says (the record
// header, which is the block header the SDK scrubs for each new holder, the token ids of its
// slots, then the KV data).
//
// ControllerLink handles the session's events once the engine serves: grants add blocks
// to the cache and reclaims take free ones back out (both on the compute thread, between
// steps), a drain stops admitting and reports when the in-flight requests are done (or at
// once when the controller calls the drain off; with a KvHandoff it first hands the keyed
// requests over: their sequences are parked with their records, and the router replays them
// on the next primary, which adopts their KV), a resume admits requests again, a stop or a
// session that ended (kDisconnected: it gave up on the controller, or could not reattach)
// ends the engine. A controller that goes away (kControllerLost) and comes back
// (kControllerBack) is logged; the engine serves on meanwhile with the blocks it holds.
//
// Threads: the memory's cache methods run on the compute thread; Pump() runs on the
// engine's control thread (main). The session, memory, cache, loop and api must outlive
// the link.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <set>
#include <span>
#include <vector>

#include "base/clock.h"
#include "base/status.h"
#include "standby/engine_api.h"
#include "standby/engine_loop.h"
#include "standby/kv/kv_handoff.h"
#include "standby/sdk/engine_sdk.h"

namespace baton {

class SessionModelMemory final : public ModelMemory {
 public:
  // Builds the weight table over the session's mapped tensors.
  static Result<std::unique_ptr<SessionModelMemory>> Create(EngineSession* session,
                                                            const LlamaConfig& config);

  const LlamaConfig& config() const override { return config_; }
  const WeightTable& weights() const override { return weights_; }
  Result<KvLayout> KvLayoutFor(const LlamaModel& model) const override;
  // Adds every mapped extent's blocks not yet in the cache.
  Status AddKvBlocks(PagedKvCache* cache) override;
  Status AddExtents(PagedKvCache* cache, std::span<const MappedExtent> extents);
  // Adds one block to the cache as held (its KV is kept for a sequence).
  Status AddHeldBlock(PagedKvCache* cache, uint32_t block);
  bool InCache(uint32_t block) const { return added_.count(block) != 0; }
  uint8_t* Block(uint32_t block) const { return session_->pool().BlockData(block); }
  // Takes up to `blocks` free blocks out of the cache, the highest first, in whole device pool
  // chunks (EngineSession::reclaim_chunk_blocks(); single blocks on the host backend): a
  // chunk goes only when every block of it is in the cache and no sequence holds one.
  // Returns them as extents.
  std::vector<MappedExtent> TakeFreeBlocks(PagedKvCache* cache, uint32_t blocks);

 private:
  SessionModelMemory(EngineSession* session, const LlamaConfig& config)
      : session_(session), config_(config) {}

  // Blocks [first, end) out of the cache if all are in it and free; else none (nothing moves).
  std::vector<uint32_t> TakeWhole(PagedKvCache* cache, uint32_t first, uint32_t end);
  Status AddTo(PagedKvCache* cache, uint32_t block, bool held);

  EngineSession* session_;
  LlamaConfig config_;
  WeightTable weights_;
  std::set<uint32_t> added_;  // pool blocks in the cache
};

// The identity of this engine's KV records: `format` (the engine's KV format name), the
// model's shape and weights as the session maps them, the layout and the block geometry. A
// successor adopts only records of its own identity.
uint64_t KvIdentityFor(std::string_view format, const EngineSession& session,
                       const LlamaConfig& config, const KvLayout& layout);

// Adopts what the predecessor left in the promoted blocks (`promoted`, a kPromoted event),
// then adds every promoted block to the cache (the adopted ones held), and tells the
// controller. A promotion before the predecessor's barrier also lists its quarantined blocks:
// their committed KV is copied into promoted blocks when the copy is estimated (at
// `copy_gbps`, measured) to take no longer than the barrier is expected to, and otherwise
// adopted in place once they come after the barrier (the wait holds MarkServing back, at most
// the controller's wait limit). Without a handoff the blocks are only added.
Result<KvAdoptionReport> AdoptPromotedBlocks(const SessionEvent& promoted, EngineSession* session,
                                             SessionModelMemory* memory, PagedKvCache* cache,
                                             KvHandoff* handoff, double copy_gbps);

// This machine's memory copy rate in GB/s (the best of a few copies of 16 MiB), for the
// choice between copying a predecessor's KV and waiting for its barrier.
double MeasureCopyGbps();

class ControllerLink {
 public:
  // `handoff` may be null (no KV handoff: a drain waits for every request).
  ControllerLink(EngineSession* session, SessionModelMemory* memory, PagedKvCache* cache,
                 EngineLoop* loop, EngineApi* api, KvHandoff* handoff, const Clock& clock)
      : session_(session),
        memory_(memory),
        cache_(cache),
        loop_(loop),
        api_(api),
        handoff_(handoff),
        clock_(clock) {}

  // Handles events until a stop, the session's end (kDisconnected), or `stop_requested`. OK
  // for an orderly stop; the reason otherwise.
  Status Pump(const std::atomic<bool>& stop_requested);

 private:
  void OnGranted(const SessionEvent& event);
  void OnReclaim(uint32_t blocks);
  void OnDrain(Duration timeout, bool successor, const std::atomic<bool>& stop_requested);

  EngineSession* session_;
  SessionModelMemory* memory_;
  PagedKvCache* cache_;
  EngineLoop* loop_;
  EngineApi* api_;
  KvHandoff* handoff_;
  const Clock& clock_;
};

}  // namespace baton
