// NcclWatcher: the engine SDK's watch over the NCCL communicators an engine registers.
//
// A thread polls ncclCommGetAsyncError on every registered communicator each interval. A
// communicator in error (anything but success or in-progress), or one whose poll itself
// fails, is reported once through `report` (the SDK forwards it to the controller, which
// fences the engine at once) and then aborted with ncclCommAbort, so that collectives stuck
// on it return. Each interval it also asks `fenced`: once that is not OK (the engine was told
// to stop, lost its controller, or reported an error) every communicator is aborted. An
// aborted communicator is forgotten; the engine must not use or destroy it afterwards.
//
// The NCCL calls go through NcclApi (NcclLibrary in production), so tests drive the watcher
// with their own functions. Every NCCL call is made under the watcher's mutex, so
// Unregister() returns only when no poll is using the communicator: unregister before
// ncclCommDestroy. Thread-safe; report and fenced are called from the watcher thread without
// the mutex held (report) or with it (fenced, which must not call back into the watcher).
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <string>
#include <thread>

#include "base/clock.h"
#include "base/mutex.h"
#include "base/status.h"
#include "cuda/nccl/nccl_library.h"

namespace baton {

struct NcclApi {
  std::function<Status(NcclComm, int*)> get_async_error;
  std::function<Status(NcclComm)> abort;
  std::function<std::string(int)> error_string;
  static NcclApi FromLibrary(const NcclLibrary& nccl);
};

struct NcclWatcherOptions {
  Duration interval = std::chrono::milliseconds(20);
  std::function<void(const Status&)> report = {};
  std::function<Status()> fenced = {};  // may be empty: never fenced
  bool start_thread = true;             // false: the caller drives PollOnce() (tests)
};

class NcclWatcher {
 public:
  NcclWatcher(NcclApi api, NcclWatcherOptions options);
  // Stops the thread; communicators still registered are left alone (the engine owns them).
  ~NcclWatcher();
  NcclWatcher(const NcclWatcher&) = delete;
  NcclWatcher& operator=(const NcclWatcher&) = delete;

  // Starts watching `comm`; `label` names it in reports ("tp-group 0").
  Status Register(NcclComm comm, std::string label);
  // Stops watching `comm`. NotFound if it was never registered or was already aborted.
  Status Unregister(NcclComm comm);
  // Aborts every registered communicator and forgets them; `why` goes to the log.
  void AbortAll(const std::string& why);
  // One round: the fence check, then a poll of each communicator.
  void PollOnce();

  size_t watched() const;
  uint64_t polls() const { return polls_.load(); }
  uint64_t aborted() const { return aborted_.load(); }

 private:
  void Run() BATON_EXCLUDES(mu_);
  // Aborts and forgets comm.
  void AbortLocked(NcclComm comm, const std::string& why) BATON_REQUIRES(mu_);

  NcclApi api_;
  NcclWatcherOptions options_;
  mutable Mutex mu_;
  CondVar wake_;
  bool stop_ BATON_GUARDED_BY(mu_) = false;
  bool fenced_ BATON_GUARDED_BY(mu_) = false;
  std::map<NcclComm, std::string> comms_ BATON_GUARDED_BY(mu_);
  std::atomic<uint64_t> polls_{0};
  std::atomic<uint64_t> aborted_{0};
  std::thread thread_;
};

}  // namespace baton
