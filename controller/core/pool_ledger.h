// PoolLedger: who may write which KV-cache pool blocks, and under which epoch.
//
// The pool is `block_count` fixed-size blocks. Blocks are lent in extents {first, count}.
// Each lease records its holder, its extent, the epoch it was granted in and whether it is
// granted (the holder may map it writable) or quarantined (the holder was fenced; the blocks
// wait for the holder to be reaped and the sync barrier to pass). Engines enter as standbys
// (nothing writable, fencing rule 5), become holders when promoted at a durable epoch, and
// leave through Fence -> ReleaseAfterBarrier. Every engine message is checked against the
// sender's epoch; a stale, future, fenced or unknown sender is refused with the reason
// (rule 4). CheckInvariants() re-derives rules 1-5 from redundant bookkeeping and names the
// first one violated.
//
// A promotion reserve (SetPromotionReserve) keeps free blocks out of Grant, so that a standby
// promoted while its predecessor's blocks are still quarantined starts on blocks the
// predecessor does not hold (GrantReserve); the quarantined blocks move only after the barrier,
// as for any fence.
//
// After a controller restart the ledger starts in recovery: every block is quarantined to
// the previous incarnation; a holder that reattaches re-adopts the blocks it holds at the
// epoch a previous controller gave it (Readopt); EndRecovery frees the rest once the caller
// has seen every previous-incarnation process not re-adopted exit and pass the barrier.
//
// Ownership: the controller owns the ledger; the ledger keeps a reference to the EpochStore,
// which must outlive it. Thread: io_context thread only.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "base/status.h"
#include "controller/core/epoch_store.h"

namespace baton {

using EngineId = uint64_t;
inline constexpr EngineId kNoEngine = 0;
// The holder of blocks quarantined at start-up until recovery ends.
inline constexpr EngineId kPreviousIncarnation = UINT64_MAX;

struct Extent {
  uint32_t first = 0;
  uint32_t count = 0;
  uint32_t end() const { return first + count; }
  bool operator==(const Extent&) const = default;
};
std::string ToString(const Extent& extent);
// "engine N", or "previous-incarnation".
std::string EngineName(EngineId id);

enum class LeaseState : uint8_t { kGranted, kQuarantined };

struct Lease {
  EngineId holder = kNoEngine;
  Extent extent;
  uint64_t epoch = 0;
  LeaseState state = LeaseState::kGranted;
};

// An engine as the ledger sees it.
enum class LedgerRole : uint8_t {
  kStandby,   // registered; maps nothing writable
  kHolder,    // promoted at `epoch`; may hold granted leases
  kFenced,    // revoked; its leases are quarantined until ReleaseAfterBarrier
  kReleased,  // reaped and past the barrier; kept as a tombstone to refuse late messages
};
const char* ToString(LedgerRole role);

struct LedgerEngine {
  LedgerRole role = LedgerRole::kStandby;
  uint64_t epoch = 0;         // the epoch of its leases (0 for a standby)
  uint64_t fenced_epoch = 0;  // the epoch it was fenced at (0 if not fenced or a standby)
  uint32_t blocks = 0;        // blocks in its leases (granted or quarantined)
  // Invariant-4 bookkeeping: sequence numbers of the last accepted message, the promotion
  // and the fence, and the epoch the last accepted message carried.
  uint64_t accepted_seq = 0;
  uint64_t accepted_epoch = 0;
  uint64_t promoted_seq = 0;
  uint64_t fenced_seq = 0;
  // Re-adopted after a restart: its epoch was issued by a previous controller, below the
  // floor of this one.
  bool readopted = false;
};

struct LedgerSnapshot {
  uint32_t block_count = 0;
  uint32_t free_blocks = 0;
  uint32_t granted_blocks = 0;
  uint32_t quarantined_blocks = 0;
  size_t leases = 0;
  size_t free_runs = 0;
  uint64_t issued_epoch = 0;  // highest epoch in use or reserved by a fence
  bool recovering = false;
  std::map<EngineId, LedgerEngine> engines;
};

class PoolLedger {
 public:
  // Deliberate faults, for tests that prove the invariant checks catch them.
  enum class Mutation {
    kNone,
    kSkipQuarantine,     // Fence frees the holder's blocks at once
    kAcceptStale,        // epoch and fence checks on engine messages are skipped
    kGrantToStandby,     // Grant does not check that the engine was promoted
    kHandOnQuarantined,  // GrantReserve also hands on a block still quarantined for its barrier
  };

  // A ledger for a fresh pool, all blocks free. `epochs` must outlive the ledger.
  PoolLedger(uint32_t block_count, const EpochStore& epochs);
  // A ledger after a controller restart: every block quarantined to kPreviousIncarnation.
  static PoolLedger Recovering(uint32_t block_count, const EpochStore& epochs);

  PoolLedger(const PoolLedger&) = delete;
  PoolLedger& operator=(const PoolLedger&) = delete;
  PoolLedger(PoolLedger&&) = default;

  // --- engines -------------------------------------------------------------------------
  Status AddStandby(EngineId id);
  // Standby -> holder at `epoch`: durable, and either above every epoch in use or the one
  // reserved by the last Fence. Each holder has its own epoch.
  Status Promote(EngineId id, uint64_t epoch);
  // Revokes a holder: all its leases become quarantined; `new_epoch` (durable, above every
  // epoch in use) is reserved for its successor.
  Status Fence(EngineId id, uint64_t new_epoch);
  // Revokes a standby (it holds nothing); later messages from it are refused.
  Status FenceStandby(EngineId id);
  // The caller states that the fenced engine is reaped and the sync barrier has passed.
  // Its quarantined blocks are freed, or granted to `new_holder` (a holder whose epoch is
  // above theirs) when given; returns the extents handed over.
  Result<std::vector<Extent>> ReleaseAfterBarrier(EngineId id, EngineId new_holder = kNoEngine);

  // --- engine messages (each checks the sender and its epoch) ---------------------------
  // Any message: OK if `id` is a live standby sending epoch 0 or a holder sending its epoch.
  Status CheckMessage(EngineId id, uint64_t epoch);
  // Grants `blocks` free blocks, all or nothing, in as few extents as possible.
  Result<std::vector<Extent>> Grant(EngineId id, uint32_t blocks, uint64_t epoch);
  // Takes back `extent`, which must lie inside granted leases of `id` at `epoch`.
  Status Return(EngineId id, Extent extent, uint64_t epoch);

  // --- device pools -------------------------------------------------------------------------
  // A device pool is mapped by chunks of `blocks_per_chunk` blocks (block b in chunk
  // b / blocks_per_chunk), and an engine maps a whole chunk as soon as it holds one of its
  // blocks. From now on Grant gives an engine only free blocks of chunks in which no other
  // engine holds or waits on blocks, so no two engines map one chunk (rule 1, checked by
  // CheckInvariants). 1, the default, places no constraint. InvalidArgument for 0.
  Status SetBlocksPerChunk(uint32_t blocks_per_chunk);
  uint32_t blocks_per_chunk() const { return blocks_per_chunk_; }
  // Free blocks that Grant could give `id` now (the promotion reserve left out).
  uint32_t GrantableTo(EngineId id) const;
  // Of those, the blocks in chunks `id` already holds blocks of: only `id` may have them, and
  // Grant gives them first (0 on an unchunked pool).
  uint32_t FreeBesideHeld(EngineId id) const;

  // --- the promotion reserve -----------------------------------------------------------------
  // Holds `blocks` free blocks back from Grant for the next promotion: whole chunks nobody
  // leases on a device pool (at least `blocks` of them, the highest first), the highest free
  // blocks otherwise. A count, not a set: the reserve is whatever such blocks are free when it
  // is asked for. FailedPrecondition (and no reserve) when the reserve in whole chunks would be
  // more than half the pool: such a pool is too small for one, and promotions wait for the
  // barrier. 0: no reserve.
  Status SetPromotionReserve(uint32_t blocks);
  // The target in blocks (whole chunks), 0 when none.
  uint32_t promotion_reserve() const { return reserve_; }
  // The free blocks held back now: the target, or fewer while the pool has fewer to spare.
  uint32_t ReserveAvailable() const;
  // Grants the whole reserve to `id`, a holder at `epoch` (promoted, its predecessor fenced):
  // FailedPrecondition, nothing granted, unless ReserveAvailable() is the whole target.
  Result<std::vector<Extent>> GrantReserve(EngineId id, uint64_t epoch);

  // --- recovery ---------------------------------------------------------------------------
  // A holder reattaching after a controller restart claims `extents` at `epoch`: issued by a
  // previous controller (0 < epoch <= the durable epoch the ledger started at), held by no
  // other holder; the blocks must still be unclaimed. The caller has checked the claim
  // against what the previous controller recorded (controller/core/roster.h).
  Status Readopt(EngineId id, uint64_t epoch, const std::vector<Extent>& extents);
  // The blocks of `extents` still unclaimed go to holder `id` (re-adopted) at its epoch, and
  // are returned. The caller states every process of a previous incarnation that may have
  // mapped them (the roster's holder of them) is reaped and past the barrier: a previous
  // controller's grant that its holder never received, or a fenced holder's blocks that go
  // on to the engine promoted before its barrier. `extents` may overlap: each block is
  // granted once.
  Result<std::vector<Extent>> GrantUnclaimed(EngineId id, const std::vector<Extent>& extents);
  // The caller states every previous-incarnation process not re-adopted is reaped and past
  // the barrier. Unclaimed blocks become free.
  Status EndRecovery();
  bool recovering() const { return recovering_; }

  // --- queries ----------------------------------------------------------------------------
  // OK if `id` may map `extent` writable now, under `epoch`.
  Status CheckMapWritable(EngineId id, Extent extent, uint64_t epoch) const;
  // The holder of a granted block, kNoEngine if free or quarantined.
  EngineId UsedBy(uint32_t block) const;
  const LedgerEngine* engine(EngineId id) const;
  std::vector<Lease> LeasesOf(EngineId id) const;
  LedgerSnapshot Snapshot() const;
  uint32_t block_count() const { return block_count_; }
  uint64_t issued_epoch() const { return issued_; }

  // Re-derives fencing rules 1-5; returns the first violated rule as
  // "invariant N (name): detail", or OK.
  Status CheckInvariants() const;

  void SetMutationForTesting(Mutation mutation) { mutation_ = mutation; }

 private:
  using LeaseMap = std::map<uint32_t, Lease>;  // keyed by extent.first
  static constexpr uint64_t kAnyEpoch = UINT64_MAX;

  LedgerEngine* Find(EngineId id);
  Status Refuse(EngineId id, Status status) const;
  Status CheckSender(EngineId id, uint64_t epoch) const;
  Status CheckNewEpoch(uint64_t epoch, const char* what) const;
  void NoteAccepted(EngineId id, uint64_t epoch);

  // The free runs Grant may take for `id`, in block order: `beside` in chunks `id` holds
  // blocks of, `clear` in chunks nobody leases (every free run on an unchunked pool), and
  // `reserve` the part of the clear runs held back for a promotion (pool_ledger_reserve.cc).
  struct FreeRuns {
    std::vector<Extent> beside;
    std::vector<Extent> clear;
    std::vector<Extent> reserve;
    uint32_t blocks() const;  // beside and clear: what Grant may take
  };
  std::vector<Extent> TakeFree(uint32_t blocks, const FreeRuns& runs);
  void AddFree(Extent extent);
  void RemoveFree(Extent extent);  // `extent` lies inside one free run
  FreeRuns FreeRunsFor(EngineId id) const;
  // Moves the promotion reserve out of `runs->clear` into `runs->reserve`.
  void HoldBackReserve(FreeRuns* runs) const;
  // Rounds `blocks` up to whole chunks (the short last chunk counts whole).
  uint32_t InWholeChunks(uint32_t blocks) const;
  // kHandOnQuarantined: moves one quarantined block of a fenced engine to `id` at `epoch`.
  void HandOnQuarantinedForTesting(EngineId id, uint64_t epoch, std::vector<Extent>* extents);
  // Per chunk: its only leaseholder, kNoEngine if none, kMixedChunk if several. Blocks of
  // kPreviousIncarnation count only when `count_previous`.
  static constexpr EngineId kMixedChunk = UINT64_MAX - 1;
  std::vector<EngineId> ChunkHolders(bool count_previous) const;
  void InsertLease(Lease lease);
  LeaseMap::iterator SplitAt(uint32_t block);
  bool CoveredBy(Extent extent, EngineId holder, LeaseState state, uint64_t epoch) const;
  std::vector<Extent> Reassign(EngineId from, EngineId to, uint64_t epoch);
  void MarkFencedFrom(EngineId from);
  void PruneTombstones();

  Status CheckTiling() const;
  Status CheckLeaseHolders() const;
  Status CheckBarrier() const;
  Status CheckEpochs() const;
  Status CheckMessages() const;
  Status CheckStandbys() const;
  Status CheckChunks() const;

  uint32_t block_count_;
  uint32_t blocks_per_chunk_ = 1;
  const EpochStore* epochs_;
  uint64_t floor_;         // the durable epoch at construction: earlier epochs are not reissued
  uint64_t issued_;        // highest epoch in use or reserved
  uint64_t reserved_ = 0;  // epoch reserved by the last Fence for a successor (0: none)
  uint32_t reserve_ = 0;   // blocks held back for the next promotion
  bool recovering_ = false;
  uint64_t seq_ = 0;
  LeaseMap leases_;
  std::map<uint32_t, uint32_t> free_;  // first -> count, coalesced
  std::map<EngineId, LedgerEngine> engines_;
  // Per block: the engine whose fence last quarantined it (kNoEngine: none, or freed after
  // that engine's barrier). A granted block's entry must name a released engine whose epoch
  // is below the lease's: it was handed over to its successor (rule 2).
  std::vector<EngineId> fenced_from_;
  Mutation mutation_ = Mutation::kNone;
};

}  // namespace baton
