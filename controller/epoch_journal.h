// EpochJournal: the production EpochStore (controller/core/epoch_store.h), the durable source
// of fencing epochs.
//
// An epoch is handed to an engine (in a promotion or a grant) only after it is durable, so
// that a restarted controller never hands out an epoch that was already used (fencing rule 3).
// The journal makes epochs durable in batches: its record holds the highest epoch that may
// have been handed out (the reservation), so an Advance() inside the reservation writes
// nothing, and Replenish() extends the reservation ahead of need, off the failover path (a
// journal fsync on this machine's virtual disk usually takes ~1 ms but was seen at 71 ms).
// A restarted controller starts after the whole reservation: epochs may skip, never repeat.
// The journal is one small file in the controller's state directory holding
// {magic, version, epoch, crc32c}, replaced atomically (write a temporary file, fsync it,
// rename it over the record, fsync the directory). A torn or garbage temporary file never
// affects the committed record; a committed record that fails its checks is refused with the
// reason, never silently reset. The journal holds an exclusive flock on `<path>.lock` for its
// lifetime so that two controllers cannot share one state directory.
//
// Ownership: the controller owns its EpochJournal (move-only: it owns the lock and directory
// fds). Thread: io_context thread only.
#pragma once

#include <cstdint>
#include <string>

#include "base/io/unique_fd.h"
#include "base/status.h"
#include "controller/core/epoch_store.h"

namespace baton {

class EpochJournal final : public EpochStore {
 public:
  // Size of the on-disk record in bytes.
  static constexpr size_t kRecordSize = 24;

  // Epochs reserved per journal write unless told otherwise.
  static constexpr uint64_t kDefaultReserveBatch = 64;

  // Opens the journal at `path`, creating it at epoch 0 if it does not exist. The parent
  // directory must exist. Each write reserves `reserve_batch` epochs (>= 1; 1: every epoch is
  // its own write). Fails with DataLoss if the record is short, has a bad magic, version or
  // CRC; with Unavailable if another process holds the journal; with InvalidArgument for a
  // batch of 0.
  static Result<EpochJournal> Open(const std::string& path,
                                   uint64_t reserve_batch = kDefaultReserveBatch);

  EpochJournal(EpochJournal&&) = default;
  EpochJournal& operator=(EpochJournal&&) = default;

  // The last epoch handed out (after Open: the reservation found on disk).
  uint64_t current() const override { return current_; }
  // Writes only when the reservation is used up.
  Result<uint64_t> Advance() override;
  // The highest epoch durable on disk; current() <= reserved().
  uint64_t reserved() const { return reserved_; }
  // Extends the reservation by a batch when less than half a batch (rounded down) is left
  // (with a batch of 1: never, every Advance writes), or when the latest write failed, so
  // that a journal that can be written again is seen to be. For quiet moments (the
  // controller's tick), so that promotions find their epoch already durable.
  Status Replenish() override;

  const std::string& path() const { return path_; }
  uint64_t reserve_batch() const { return reserve_batch_; }
  // The outcome of the latest write (OK before the first), and how many writes failed.
  Status last_write() const override { return last_write_; }
  uint64_t write_failures() const override { return write_failures_; }

  // Encodes/decodes one record (exposed for tests and tools).
  static std::string EncodeRecord(uint64_t epoch);
  static Result<uint64_t> DecodeRecord(const std::string& bytes, const std::string& where);

 private:
  EpochJournal(std::string path, UniqueFd dir, UniqueFd lock, uint64_t reserve_batch)
      : path_(std::move(path)),
        dir_(std::move(dir)),
        lock_(std::move(lock)),
        reserve_batch_(reserve_batch) {}

  // Durably replaces the record with `epoch`; records the outcome (last_write()).
  Status Commit(uint64_t epoch);
  Status WriteRecord(uint64_t epoch);
  // Durably reserves a batch past max(attempted, current) and at least through `through`.
  Status Reserve(uint64_t through);

  std::string path_;
  UniqueFd dir_;   // the parent directory, fsynced after each rename
  UniqueFd lock_;  // `<path>.lock`, flock(LOCK_EX) held while open
  uint64_t current_ = 0;
  uint64_t reserved_ = 0;
  uint64_t attempted_ = 0;  // highest reservation ever written or attempted
  uint64_t reserve_batch_;
  Status last_write_;
  uint64_t write_failures_ = 0;
};

}  // namespace baton
