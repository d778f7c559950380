// KV-warm failover in the controller simulation (sim_world.h): the pool's bytes, and the KV
// side of each simulated engine, run by the production code (standby/kv/kv_handoff.h).
//
// Every serving engine writes KV records into the blocks it maps, through KvHandoff as the
// reference engine does (Committed after each step, Releasing before a block is freed);
// an engine that dies may die inside a commit (a torn record). A promoted engine reads the
// records of the blocks its Promote hands it (KvHandoff::Adopt) and continues some of the
// adopted requests (KvHandoff::Continue). An engine promoted before its predecessor's barrier
// plans a copy of the predecessor's quarantined blocks (KvHandoff::PlanCopy) and copies them
// into blocks of its own (KvHandoff::CopyIn) while the dying predecessor still writes them
// (GhostStep, before and during the copy), or waits for them and adopts them in place. The
// pool remembers, apart from the records, who last committed each block, at which epoch, and
// whether the commit was torn: the ground truth against which rule 6 is checked when a block
// is adopted or copied:
//
//   6. adoption reads only fenced KV: an adopted block is in the adopter's Promote or the
//      Grant of its predecessor's blocks after their barrier, and holds a whole commit (not a
//      torn one) of an engine that is dead and past its barrier, at an epoch below the
//      adopter's; a copied block was copied from a block of the predecessor's quarantine
//      into one of the adopter's own, and holds the whole commit (by a fenced engine, at an
//      epoch below the adopter's) that the source held, unchanged, from the plan to the end of
//      the copy; and a request continues only from KV that is its own tokens'.
//
// Ownership: the world owns the pool and one SimEngineKv per engine (through SimEngine);
// a SimEngineKv keeps a reference to the pool and the clock. Header-only test support;
// single-threaded; deterministic for a given seed.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/clock.h"
#include "controller/core/coordinator.h"
#include "proto/messages.h"
#include "standby/kv/kv_handoff.h"
#include "standby/kv/kv_record.h"
#include "standby/model/paged_kv.h"
#include "tests/controller/sim_engine.h"

namespace baton::sim {

inline constexpr int kSimBlockTokens = 4;
inline constexpr KvLayout kSimKvLayout{
    .layers = 1, .kv_heads = 1, .head_dim = 1, .block_tokens = kSimBlockTokens};
inline constexpr uint64_t kSimKvIdentity = 0x5349'4d4b'5631ull;

// The pool's bytes (each block: a record header, its token ids, its tiny KV) and the truth
// of who wrote them.
class SimKvPool {
 public:
  struct Written {
    EngineId writer = kNoEngine;
    uint64_t epoch = 0;
    bool torn = false;
    uint64_t serial = 0;  // which write: any later one changes it
  };

  explicit SimKvPool(uint32_t blocks)
      : stride_(KvDataOffset(kSimBlockTokens) + kSimKvLayout.block_bytes()),
        bytes_(size_t{blocks} * stride_) {}

  uint8_t* block(uint32_t b) { return bytes_.data() + size_t{b} * stride_; }
  size_t stride() const { return stride_; }
  void* data(uint32_t b) { return block(b) + KvDataOffset(kSimBlockTokens); }
  size_t data_bytes() const { return kSimKvLayout.block_bytes(); }

  // The blocks of `kv` from index `first` were committed by `writer` at `epoch`.
  void Wrote(const KvSequence& kv, size_t first, EngineId writer, uint64_t epoch) {
    for (size_t i = first; i < kv.blocks.size(); ++i) Wrote(kv.blocks[i], writer, epoch);
  }
  void Wrote(uint32_t b, EngineId writer, uint64_t epoch) {
    written_[b] = {writer, epoch, false, ++serial_};
  }
  // Its writer dies inside the commit of block `b` (its commit counter left odd).
  void Tear(uint32_t b) {
    uint32_t commit = 0;
    std::memcpy(&commit, block(b) + 4, sizeof(commit));
    commit |= 1;
    std::memcpy(block(b) + 4, &commit, sizeof(commit));
    written_[b].torn = true;
  }
  std::optional<Written> WrittenBy(uint32_t b) const {
    auto it = written_.find(b);
    return it == written_.end() ? std::nullopt : std::optional<Written>(it->second);
  }

  // The token ids generated so far for each request key (the router's memory of a stream);
  // the most recent 64 requests.
  void Generated(const KvRequestKey& key, const std::vector<int32_t>& tokens) {
    if (generated_.count(key) == 0) order_.push_back(key);
    generated_[key] = tokens;
    while (order_.size() > 64) {
      generated_.erase(order_.front());
      order_.erase(order_.begin());
    }
  }
  const std::map<KvRequestKey, std::vector<int32_t>>& generated() const { return generated_; }

 private:
  size_t stride_;
  std::vector<uint8_t> bytes_;
  std::map<uint32_t, Written> written_;
  uint64_t serial_ = 0;
  std::map<KvRequestKey, std::vector<int32_t>> generated_;
  std::vector<KvRequestKey> order_;
};

// What a simulated engine's KV does; `flag` reports a broken rule.
class SimEngineKv {
 public:
  using Flag = std::function<void(const std::string&)>;

  SimEngineKv(SimKvPool& pool, const Clock& clock, EngineId id, const uint64_t* epoch)
      : pool_(pool),
        id_(id),
        epoch_(epoch),
        cache_(PagedKvCache::Create(kSimKvLayout).value()),
        handoff_(&cache_, KvHandoffOptions{.identity = kSimKvIdentity,
                                           .block_tokens = kSimBlockTokens,
                                           .block = [this](uint32_t b) { return pool_.block(b); },
                                           .epoch = [this] { return *epoch_; },
                                           .block_bytes = pool.stride(),
                                           .keep_for = std::chrono::seconds(1),
                                           .clock = &clock,
                                           .metrics = nullptr}) {}
  SimEngineKv(const SimEngineKv&) = delete;
  SimEngineKv& operator=(const SimEngineKv&) = delete;

  // The blocks of a Grant (or the rest of a Promote) join the cache as free, their headers
  // scrubbed as the SDK scrubs them.
  void Map(const std::vector<proto::BlockRange>& extents) {
    for (const proto::BlockRange& r : extents) {
      for (uint32_t b = r.first; b < r.first + r.count; ++b) {
        if (!known_.insert(b).second) continue;
        std::memset(pool_.block(b), 0, kKvRecordHeaderBytes);
        (void)cache_.AddBlock(b, pool_.data(b), pool_.data_bytes());
      }
    }
  }

  // A promotion before the barrier: the sequences of the predecessor's `quarantined` blocks
  // that a copy would keep, and the truth of their blocks at this moment.
  KvCopyPlan Plan(const std::vector<proto::BlockRange>& quarantined) {
    std::vector<KvBlockRun> runs;
    std::vector<uint8_t> headers;
    for (const proto::BlockRange& r : quarantined) {
      runs.push_back(KvBlockRun{r.first, r.count});
      for (uint32_t b = r.first; b < r.first + r.count; ++b) {
        headers.insert(headers.end(), pool_.block(b), pool_.block(b) + kKvRecordHeaderBytes);
        planned_[b] = pool_.WrittenBy(b);
      }
    }
    return handoff_.PlanCopy(runs, headers);
  }

  // Copies `plan` into the blocks of `own` it does not use yet, with `ghost` (the dying
  // writer) run before the copy and after each sequence's copy; checks rule 6 on every copy
  // kept. `is_fenced(writer)`: the writer was killed or is dead.
  KvAdoptionReport CopyIn(const KvCopyPlan& plan, const std::vector<proto::BlockRange>& quarantined,
                          const std::vector<proto::BlockRange>& own,
                          const std::function<void()>& ghost,
                          const std::function<bool(EngineId)>& is_fenced, const Flag& flag) {
    std::vector<uint32_t> free;
    for (const proto::BlockRange& r : own) {
      for (uint32_t b = r.first; b < r.first + r.count; ++b) {
        if (known_.count(b) == 0) free.push_back(b);
      }
    }
    size_t next = 0;
    auto take = [&]() -> Result<uint32_t> {
      if (next == free.size()) return ResourceExhausted("no free block to copy into");
      const uint32_t b = free[next++];
      BATON_RETURN_IF_ERROR(cache_.AddHeldBlock(b, pool_.data(b), pool_.data_bytes()));
      known_.insert(b);
      return b;
    };
    std::set<uint32_t> from;
    for (const proto::BlockRange& r : quarantined) {
      for (uint32_t b = r.first; b < r.first + r.count; ++b) from.insert(b);
    }
    // The truth of the sources when each sequence is checked (after its `ghost`).
    std::vector<std::map<uint32_t, std::optional<SimKvPool::Written>>> at_check;
    auto between = [&] {
      ghost();
      std::map<uint32_t, std::optional<SimKvPool::Written>> now;
      for (uint32_t b : from) now[b] = pool_.WrittenBy(b);
      at_check.push_back(std::move(now));
    };
    ghost();
    std::vector<std::pair<uint32_t, uint32_t>> kept;
    const KvAdoptionReport report = handoff_.CopyIn(plan, take, between, &kept);
    std::map<uint32_t, size_t> sequence_of;
    for (size_t i = 0; i < plan.sequences.size(); ++i) {
      for (const KvRecordRead& r : plan.sequences[i].records) sequence_of[r.record.block] = i;
    }
    for (const auto& [src, dst] : kept) {
      const size_t i = sequence_of.count(src) ? sequence_of[src] : 0;
      CheckCopied(src, dst, from, free, i < at_check.size() ? at_check[i][src] : std::nullopt,
                  is_fenced, flag);
      adopted_.insert(dst);
      pool_.Wrote(dst, id_, *epoch_);  // its record, rewritten at this epoch
    }
    planned_.clear();
    return report;
  }

  // A step of an engine that was killed, or whose device work runs on after its death: its
  // sequences grow (each step's records committed) and some finish (their records cleared,
  // their blocks reused by a new sequence). Nobody sees its tokens.
  void GhostStep(Rng& rng) {
    for (auto it = seqs_.begin(); it != seqs_.end();) {
      it->tokens.push_back(static_cast<int32_t>(rng.Range(1, 1000)));
      if (!Grow(*it, /*seen=*/false) || rng.Chance(25)) {
        Finish(*it);
        it = seqs_.erase(it);
        continue;
      }
      ++it;
    }
    if (seqs_.size() < 3 && rng.Chance(50)) {
      Seq s;
      s.request.id = ++next_request_;
      s.request.key = KvRequestKey{rng.Next() | 1, rng.Next()};
      s.tokens.resize(rng.Range(1, 9));
      for (int32_t& t : s.tokens) t = static_cast<int32_t>(rng.Range(1, 1000));
      if (Grow(s, /*seen=*/false)) {
        seqs_.push_back(std::move(s));
      } else {
        Finish(s);
      }
    }
    ++ghost_steps_;
  }
  uint64_t ghost_steps() const { return ghost_steps_; }

  // A Promote at `*epoch_` hands over `extents`: their records are read (from header copies,
  // as the SDK takes them) and what passes is kept; the other blocks join the cache free
  // (`map_rest`; a copy of the predecessor's quarantine takes them first otherwise).
  // `is_fenced(writer)` says whether an engine is dead and past its barrier. Returns the
  // report the engine sends.
  KvAdoptionReport Adopt(const std::vector<proto::BlockRange>& extents,
                         const std::function<bool(EngineId)>& is_fenced, const Flag& flag,
                         bool map_rest = true) {
    std::vector<KvBlockRun> runs;
    std::vector<uint8_t> headers;
    std::set<uint32_t> granted;
    for (const proto::BlockRange& r : extents) {
      runs.push_back(KvBlockRun{r.first, r.count});
      for (uint32_t b = r.first; b < r.first + r.count; ++b) {
        granted.insert(b);
        headers.insert(headers.end(), pool_.block(b), pool_.block(b) + kKvRecordHeaderBytes);
      }
    }
    auto hold = [&](uint32_t b) -> Status {
      CheckAdoptable(b, granted, is_fenced, flag);
      BATON_RETURN_IF_ERROR(cache_.AddHeldBlock(b, pool_.data(b), pool_.data_bytes()));
      known_.insert(b);
      adopted_.insert(b);
      return OkStatus();
    };
    std::set<uint32_t> before = adopted_;
    KvAdoptionReport report = handoff_.Adopt(runs, headers, hold);
    for (uint32_t b : adopted_) {
      if (before.count(b) == 0) pool_.Wrote(b, id_, *epoch_);  // the kept records, rewritten
    }
    if (map_rest) Map(extents);
    return report;
  }

  // One step of generation: each running sequence gets a token (and its records); a new
  // request starts, fresh or a replay of one the pool knows (continued from adopted KV when
  // this engine kept it); some finish.
  void Step(Rng& rng, uint64_t* continued, const Flag& flag) {
    if (seqs_.size() < 3 && rng.Chance(40)) Start(rng, continued, flag);
    for (auto it = seqs_.begin(); it != seqs_.end();) {
      Seq& s = *it;
      s.tokens.push_back(static_cast<int32_t>(rng.Range(1, 1000)));
      if (!Grow(s) || rng.Chance(8)) {
        Finish(s);
        it = seqs_.erase(it);
        continue;
      }
      ++it;
    }
    (void)handoff_.Expire();
  }

  // Blocks leave the engine (a Reclaim, or a return it chose): what uses them is freed
  // first, every kept sequence with it, then the cache forgets them.
  void Give(const std::set<uint32_t>& blocks) {
    for (auto it = seqs_.begin(); it != seqs_.end();) {
      const bool uses = std::any_of(it->kv.blocks.begin(), it->kv.blocks.end(),
                                    [&](uint32_t b) { return blocks.count(b) != 0; });
      if (uses) {
        Finish(*it);
        it = seqs_.erase(it);
      } else {
        ++it;
      }
    }
    handoff_.Evict(SIZE_MAX);
    for (uint32_t b : blocks) {
      (void)cache_.RemoveBlock(b);
      known_.erase(b);
      adopted_.erase(b);
    }
  }

  // It dies; with `tear`, inside the commit of the last block it wrote (if it still maps it).
  void Die(bool tear) {
    if (tear && last_written_.has_value() && known_.count(*last_written_) != 0) {
      pool_.Tear(*last_written_);
    }
  }

  // The blocks it adopted and still maps (kept, continued, or freed in its cache since).
  const std::set<uint32_t>& adopted() const { return adopted_; }

 private:
  struct Seq {
    GenerationRequest request;
    KvSequence kv;
    std::vector<int32_t> tokens;
  };

  void CheckAdoptable(uint32_t b, const std::set<uint32_t>& granted,
                      const std::function<bool(EngineId)>& is_fenced, const Flag& flag) const {
    const std::string where = "invariant 6 (adoption reads only fenced KV): engine " +
                              std::to_string(id_) + " at epoch " + std::to_string(*epoch_) +
                              " adopted block " + std::to_string(b);
    const std::optional<SimKvPool::Written> w = pool_.WrittenBy(b);
    if (granted.count(b) == 0) return flag(where + ", which its Promote did not hand it");
    if (!w.has_value()) return flag(where + ", which no engine wrote");
    if (w->torn)
      return flag(where + ", whose record engine " + std::to_string(w->writer) +
                  " was still writing when it died");
    if (w->writer == id_ || !is_fenced(w->writer)) {  // (a forgotten engine is long dead)
      return flag(where + " while its writer, engine " + std::to_string(w->writer) +
                  ", was not dead and past its barrier");
    }
    if (w->epoch >= *epoch_) {
      return flag(where + ", written at epoch " + std::to_string(w->epoch) + " (not below)");
    }
  }

  void CheckCopied(uint32_t src, uint32_t dst, const std::set<uint32_t>& quarantined,
                   const std::vector<uint32_t>& own, const std::optional<SimKvPool::Written>& now,
                   const std::function<bool(EngineId)>& is_fenced, const Flag& flag) const {
    const std::string where = "invariant 6 (adoption reads only fenced KV): engine " +
                              std::to_string(id_) + " at epoch " + std::to_string(*epoch_) +
                              " kept a copy of block " + std::to_string(src) + " in block " +
                              std::to_string(dst);
    if (quarantined.count(src) == 0)
      return flag(where + ", which is not in its predecessor's quarantine");
    if (std::find(own.begin(), own.end(), dst) == own.end()) {
      return flag(where + ", which is not a free block of its own");
    }
    auto it = planned_.find(src);
    const std::optional<SimKvPool::Written> then = it != planned_.end() ? it->second : std::nullopt;
    if (!then.has_value()) return flag(where + ", which no engine wrote");
    if (then->torn) return flag(where + ", whose record was torn");
    if (then->writer == id_ || !is_fenced(then->writer)) {
      return flag(where + " while its writer, engine " + std::to_string(then->writer) +
                  ", was not fenced");
    }
    if (then->epoch >= *epoch_) return flag(where + ", written at an epoch not below its own");
    if (!now.has_value() || now->writer != then->writer || now->epoch != then->epoch || now->torn ||
        now->serial != then->serial) {
      return flag(where + ", which its writer wrote again during the copy");
    }
  }

  void Start(Rng& rng, uint64_t* continued, const Flag& flag) {
    Seq s;
    s.request.id = ++next_request_;
    const auto& known = pool_.generated();
    if (!known.empty() && rng.Chance(50)) {  // a replay: the tokens sent so far, and one more
      auto it = known.begin();
      std::advance(it, rng.Range(0, known.size() - 1));
      if (std::none_of(seqs_.begin(), seqs_.end(),
                       [&](const Seq& x) { return x.request.key == it->first; })) {
        s.request.key = it->first;
        s.tokens = it->second;
      }
    }
    if (s.request.key.empty()) {
      s.request.key = KvRequestKey{rng.Next() | 1, rng.Next()};
      s.tokens.resize(rng.Range(1, 9));
      for (int32_t& t : s.tokens) t = static_cast<int32_t>(rng.Range(1, 1000));
    }
    s.tokens.push_back(static_cast<int32_t>(rng.Range(1, 1000)));
    const int64_t use = handoff_.Continue(s.request, s.tokens, &s.kv);
    *continued += use > 0;
    if (use > 0) CheckContinued(s, use, flag);
    if (use > 0) pool_.Wrote(s.kv, s.kv.blocks.size() - 1, id_, *epoch_);
    if (!Grow(s)) return Finish(s);
    seqs_.push_back(std::move(s));
  }

  // A continuation starts on adopted blocks whose KV is that of its first `use` tokens (the
  // tiny model's K and V of a token are its id).
  void CheckContinued(const Seq& s, int64_t use, const Flag& flag) {
    for (uint32_t b : s.kv.blocks) {
      if (adopted_.count(b) == 0) {
        return flag("invariant 6 (adoption reads only fenced KV): engine " + std::to_string(id_) +
                    " continued a request on block " + std::to_string(b) +
                    ", which it never adopted");
      }
    }
    for (int64_t pos = 0; pos < use; ++pos) {
      const float want = static_cast<float>(s.tokens[static_cast<size_t>(pos)]);
      if (*cache_.Row(s.kv, 0, 0, 0, pos) != want || *cache_.Row(s.kv, 0, 1, 0, pos) != want) {
        return flag("invariant 6 (adoption reads only fenced KV): engine " + std::to_string(id_) +
                    " continued a request from KV that is not its tokens' (position " +
                    std::to_string(pos) + ")");
      }
    }
  }

  // The sequence's KV now holds every token: blocks reserved (kept KV yielding if short),
  // its K and V written, then the step's records committed.
  bool Grow(Seq& s, bool seen = true) {
    const int64_t before = s.kv.length;
    const auto want = static_cast<int64_t>(s.tokens.size());
    if (!cache_.Reserve(&s.kv, want).ok()) {
      handoff_.Evict(static_cast<size_t>(cache_.BlocksFor(want)));
      if (!cache_.Reserve(&s.kv, want).ok()) return false;
    }
    for (int64_t pos = before; pos < want; ++pos) {
      const auto id = static_cast<float>(s.tokens[static_cast<size_t>(pos)]);
      *cache_.Row(s.kv, 0, 0, 0, pos) = id;
      *cache_.Row(s.kv, 0, 1, 0, pos) = id;
    }
    s.kv.length = want;
    handoff_.Committed(s.request, s.kv, s.tokens, before);
    const size_t first = static_cast<size_t>(before / kSimBlockTokens);
    pool_.Wrote(s.kv, first, id_, *epoch_);
    last_written_ = s.kv.blocks.back();
    if (seen) pool_.Generated(s.request.key, s.tokens);
    return true;
  }

  void Finish(Seq& s) {
    handoff_.Releasing(s.kv);
    cache_.Release(&s.kv);
  }

  SimKvPool& pool_;
  EngineId id_;
  const uint64_t* epoch_;
  PagedKvCache cache_;
  KvHandoff handoff_;
  std::set<uint32_t> known_;
  std::set<uint32_t> adopted_;
  std::vector<Seq> seqs_;
  std::optional<uint32_t> last_written_;
  uint64_t next_request_ = 0;
  std::map<uint32_t, std::optional<SimKvPool::Written>> planned_;  // the truth at PlanCopy
  uint64_t ghost_steps_ = 0;
};

// Adopted blocks count as their adopter's in the ledger (rule 6), while it serves, talks to
// the controller and maps them.
inline Status CheckAdoptedHeld(const std::map<EngineId, SimEngine>& engines,
                               const Coordinator& coord) {
  for (const auto& [id, e] : engines) {
    const EngineRecord* r = coord.engine(id);
    if (!e.Working() || !e.attached || r == nullptr || !r->live() ||
        !(r->is(EngineState::kPrimary) || r->is(EngineState::kDraining))) {
      continue;
    }
    for (uint32_t b : e.kv->adopted()) {
      const EngineId holder = coord.ledger().UsedBy(b);
      if (holder == id) continue;
      return Internal("invariant 6 (adoption reads only fenced KV): engine " + std::to_string(id) +
                      " adopted block " + std::to_string(b) +
                      ", which the ledger gives to engine " + std::to_string(holder));
    }
  }
  return OkStatus();
}

}  // namespace baton::sim
