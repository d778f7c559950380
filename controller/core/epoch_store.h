// EpochStore: where the Coordinator and the ledger get fencing epochs from. An epoch is handed
// to an engine (in a promotion or a grant) only after it is durable, so that a restarted
// controller never hands out an epoch that was already used (fencing rule 3). The production
// store is the EpochJournal (controller/epoch_journal.h), a file in the state directory; the
// simulation and the tests use stores of their own.
//
// Ownership: the caller owns the store and lends it to the Coordinator. Thread: the
// Coordinator's.
#pragma once

#include <cstdint>

#include "base/status.h"

namespace baton {

class EpochStore {
 public:
  virtual ~EpochStore() = default;

  // The highest durable epoch. 0 means none was ever issued.
  virtual uint64_t current() const = 0;

  // Makes a new epoch, strictly greater than every epoch this store has returned or
  // attempted, durable and returns it. On error nothing was committed that current() shows,
  // but the attempted number is never returned later either (it may be on disk).
  virtual Result<uint64_t> Advance() = 0;

  // Makes epochs durable ahead of need, at a quiet moment (a store that reserves none: OK).
  virtual Status Replenish() { return OkStatus(); }
  // The outcome of the latest write (OK before the first), and how many writes failed.
  virtual Status last_write() const { return OkStatus(); }
  virtual uint64_t write_failures() const { return 0; }
};

}  // namespace baton
