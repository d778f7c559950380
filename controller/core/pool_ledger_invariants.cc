// PoolLedger::CheckInvariants: fencing rules 1-5 re-derived from the ledger's redundant
// bookkeeping (lease map, free runs, engine table, per-block fence marks, message sequence
// numbers). Used by the tests after every simulated step and by the controller's self-check.
#include <string>
#include <vector>

#include "controller/core/pool_ledger.h"

namespace baton {
namespace {

Status Violation(int rule, const char* name, const std::string& detail) {
  return Internal("invariant " + std::to_string(rule) + " (" + name + "): " + detail);
}

constexpr const char* kOneWriter = "one writer per block";
constexpr const char* kBarrier = "no use before reap and barrier";
constexpr const char* kMonotonic = "epochs monotonic and durable";
constexpr const char* kStale = "stale messages refused";
constexpr const char* kStandby = "standby maps nothing writable";

}  // namespace

Status PoolLedger::CheckInvariants() const {
  BATON_RETURN_IF_ERROR(CheckTiling());
  BATON_RETURN_IF_ERROR(CheckChunks());
  BATON_RETURN_IF_ERROR(CheckLeaseHolders());
  BATON_RETURN_IF_ERROR(CheckBarrier());
  BATON_RETURN_IF_ERROR(CheckEpochs());
  BATON_RETURN_IF_ERROR(CheckMessages());
  return CheckStandbys();
}

// Rule 1: leases and free runs tile the pool exactly; no block is in two records.
Status PoolLedger::CheckTiling() const {
  struct Piece {
    uint32_t first, count;
    EngineId holder;  // kNoEngine for a free run
  };
  std::vector<Piece> pieces;
  pieces.reserve(leases_.size() + free_.size());
  auto lease = leases_.begin();
  auto run = free_.begin();
  while (lease != leases_.end() || run != free_.end()) {
    const bool take_lease =
        run == free_.end() || (lease != leases_.end() && lease->first < run->first);
    if (take_lease) {
      pieces.push_back({lease->first, lease->second.extent.count, lease->second.holder});
      ++lease;
    } else {
      pieces.push_back({run->first, run->second, kNoEngine});
      ++run;
    }
  }
  uint32_t pos = 0;
  for (const Piece& p : pieces) {
    // Named only when broken: this runs after every controller event.
    auto what = [&p] {
      return p.holder == kNoEngine ? std::string("a free run")
                                   : "a lease of " + EngineName(p.holder);
    };
    if (p.count == 0) return Violation(1, kOneWriter, what() + " is empty");
    if (p.first < pos) {
      return Violation(1, kOneWriter,
                       "block " + std::to_string(p.first) + " is in two records (" + what() + ")");
    }
    if (p.first > pos) {
      return Violation(1, kOneWriter, "block " + std::to_string(pos) + " is in no record");
    }
    pos = p.first + p.count;
  }
  if (pos != block_count_) {
    return Violation(
        1, kOneWriter,
        "records cover " + std::to_string(pos) + " of " + std::to_string(block_count_) + " blocks");
  }
  return OkStatus();
}

// Rule 1: a granted lease belongs to a live holder; block counts agree with the leases.
// Rule 2: a quarantined lease belongs to an engine not yet released.
Status PoolLedger::CheckLeaseHolders() const {
  std::map<EngineId, uint32_t> counted;
  for (const auto& entry : leases_) {
    const auto& lease = entry.second;  // a named variable: clang 14 captures no binding
    counted[lease.holder] += lease.extent.count;
    auto where = [&lease] {
      return "blocks " + ToString(lease.extent) + " of " + EngineName(lease.holder);
    };
    if (lease.holder == kPreviousIncarnation) {
      if (lease.state != LeaseState::kQuarantined || !recovering_) {
        return Violation(2, kBarrier, where() + " outlive the recovery");
      }
      continue;
    }
    const LedgerEngine* e = engine(lease.holder);
    if (e == nullptr) return Violation(1, kOneWriter, where() + ": the holder is unknown");
    if (lease.state == LeaseState::kGranted && e->role != LedgerRole::kHolder &&
        e->role != LedgerRole::kStandby) {
      return Violation(1, kOneWriter,
                       where() + " are granted to a " + ToString(e->role) + " engine");
    }
    if (lease.state == LeaseState::kQuarantined && e->role != LedgerRole::kFenced) {
      return Violation(2, kBarrier,
                       where() + " are quarantined under a " + ToString(e->role) + " engine");
    }
  }
  for (const auto& [id, e] : engines_) {
    const uint32_t have = counted.count(id) ? counted.at(id) : 0;
    if (have != e.blocks) {
      return Violation(1, kOneWriter,
                       EngineName(id) + " counts " + std::to_string(e.blocks) +
                           " blocks but its leases hold " + std::to_string(have));
    }
  }
  return OkStatus();
}

// Rule 2: every granted block last quarantined by a fence names an engine that has been
// released (reaped, barrier passed), and the new lease's epoch is above the fenced one's.
Status PoolLedger::CheckBarrier() const {
  for (const auto& entry : leases_) {
    const uint32_t first = entry.first;
    const auto& lease = entry.second;  // a named variable: clang 14 captures no binding
    if (lease.state != LeaseState::kGranted) continue;
    for (uint32_t b = first; b < lease.extent.end(); ++b) {
      const EngineId from = fenced_from_[b];
      if (from == kNoEngine || from == lease.holder) continue;
      auto where = [&lease, b] {
        return "block " + std::to_string(b) + " granted to " + EngineName(lease.holder) +
               " at epoch " + std::to_string(lease.epoch);
      };
      if (from == kPreviousIncarnation) {
        if (recovering_) return Violation(2, kBarrier, where() + " before recovery ended");
        continue;
      }
      const LedgerEngine* old = engine(from);
      if (old == nullptr) continue;  // pruned tombstones were released
      if (old->role != LedgerRole::kReleased) {
        return Violation(2, kBarrier,
                         where() + " while " + EngineName(from) + " (" + ToString(old->role) +
                             ") is not reaped and past the barrier");
      }
      if (old->epoch >= lease.epoch) {
        return Violation(2, kBarrier,
                         where() + " is not above " + EngineName(from) + "'s epoch " +
                             std::to_string(old->epoch));
      }
    }
  }
  return OkStatus();
}

// Rule 3: the issued epoch is durable and never below the start-up floor; every holder's
// epoch is at or below it, distinct, and its leases carry it.
Status PoolLedger::CheckEpochs() const {
  const uint64_t durable = epochs_->current();
  if (durable < floor_) {
    return Violation(
        3, kMonotonic,
        "the journal went back from " + std::to_string(floor_) + " to " + std::to_string(durable));
  }
  if (issued_ > durable) {
    return Violation(3, kMonotonic,
                     "epoch " + std::to_string(issued_) +
                         " in use before it was durable (journal at " + std::to_string(durable) +
                         ")");
  }
  std::map<uint64_t, EngineId> holders;
  for (const auto& [id, e] : engines_) {
    if (e.epoch > issued_) {
      return Violation(3, kMonotonic,
                       EngineName(id) + " holds epoch " + std::to_string(e.epoch) +
                           " above the issued " + std::to_string(issued_));
    }
    if (e.role != LedgerRole::kHolder) continue;
    if (e.epoch < floor_ && !e.readopted) {
      return Violation(3, kMonotonic,
                       EngineName(id) + " holds epoch " + std::to_string(e.epoch) +
                           " from before the restart at " + std::to_string(floor_));
    }
    auto [it, fresh] = holders.emplace(e.epoch, id);
    if (!fresh) {
      return Violation(3, kMonotonic,
                       "epoch " + std::to_string(e.epoch) + " reused by " + EngineName(it->second) +
                           " and " + EngineName(id));
    }
  }
  for (const auto& [first, lease] : leases_) {
    if (lease.state != LeaseState::kGranted) continue;
    const LedgerEngine* e = engine(lease.holder);
    if (e != nullptr && lease.epoch != e->epoch) {
      return Violation(3, kMonotonic,
                       "lease " + ToString(lease.extent) + " carries epoch " +
                           std::to_string(lease.epoch) + " but " + EngineName(lease.holder) +
                           " holds " + std::to_string(e->epoch));
    }
  }
  return OkStatus();
}

// Rule 4: no message accepted from an engine after its fence, and the last accepted
// message since its promotion carried its own epoch.
Status PoolLedger::CheckMessages() const {
  for (const auto& [id, e] : engines_) {
    if (e.fenced_seq != 0 && e.accepted_seq > e.fenced_seq) {
      return Violation(4, kStale,
                       "a message from " + EngineName(id) + " was accepted after its fence");
    }
    if (e.accepted_seq > e.promoted_seq && e.accepted_epoch != e.epoch) {
      return Violation(4, kStale,
                       "a message at epoch " + std::to_string(e.accepted_epoch) + " from " +
                           EngineName(id) + " (epoch " + std::to_string(e.epoch) +
                           ") was accepted");
    }
  }
  return OkStatus();
}

// Rule 5: an engine never promoted holds no lease.
Status PoolLedger::CheckStandbys() const {
  for (const auto& [id, e] : engines_) {
    if (e.epoch == 0 && e.blocks != 0) {
      return Violation(5, kStandby,
                       EngineName(id) + " (" + ToString(e.role) + ", never promoted) holds " +
                           std::to_string(e.blocks) + " blocks");
    }
  }
  return OkStatus();
}

}  // namespace baton
