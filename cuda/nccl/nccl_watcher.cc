#include "cuda/nccl/nccl_watcher.h"

#include <sstream>
#include <vector>

#include "base/log.h"

namespace baton {
namespace {

constexpr const char* kLog = "nccl-watcher";

std::string Describe(NcclComm comm, const std::string& label) {
  std::ostringstream out;
  out << "NCCL communicator " << (label.empty() ? "" : label + " ") << "(" << comm << ")";
  return out.str();
}

}  // namespace

NcclApi NcclApi::FromLibrary(const NcclLibrary& nccl) {
  const NcclLibrary* lib = &nccl;
  return NcclApi{
      .get_async_error = [lib](NcclComm c, int* r) { return lib->GetAsyncError(c, r); },
      .abort = [lib](NcclComm c) { return lib->Abort(c); },
      .error_string = [lib](int r) { return lib->ErrorString(r); },
  };
}

NcclWatcher::NcclWatcher(NcclApi api, NcclWatcherOptions options)
    : api_(std::move(api)), options_(std::move(options)) {
  if (options_.start_thread) thread_ = std::thread([this] { Run(); });
}

NcclWatcher::~NcclWatcher() {
  {
    MutexLock lock(mu_);
    stop_ = true;
  }
  wake_.NotifyAll();
  if (thread_.joinable()) thread_.join();
}

Status NcclWatcher::Register(NcclComm comm, std::string label) {
  if (comm == nullptr) return InvalidArgument("cannot watch a NULL NCCL communicator");
  MutexLock lock(mu_);
  if (fenced_) return FailedPrecondition("the engine is fenced: no new NCCL communicators");
  if (!comms_.emplace(comm, std::move(label)).second) {
    return FailedPrecondition(Describe(comm, "") + " is already watched");
  }
  return OkStatus();
}

Status NcclWatcher::Unregister(NcclComm comm) {
  MutexLock lock(mu_);
  if (comms_.erase(comm) == 0) {
    return NotFound(Describe(comm, "") + " is not watched (never registered, or aborted)");
  }
  return OkStatus();
}

void NcclWatcher::AbortLocked(NcclComm comm, const std::string& why) {
  auto it = comms_.find(comm);
  if (it == comms_.end()) return;
  const std::string name = Describe(comm, it->second);
  comms_.erase(it);
  Status aborted = api_.abort(comm);
  ++aborted_;
  if (aborted.ok()) {
    BATON_LOG(WARN, kLog) << name << " aborted: " << why;
  } else {
    BATON_LOG(ERROR, kLog) << name << ": abort after '" << why << "' failed: " << aborted.message();
  }
}

void NcclWatcher::AbortAll(const std::string& why) {
  MutexLock lock(mu_);
  fenced_ = true;
  while (!comms_.empty()) AbortLocked(comms_.begin()->first, why);
}

void NcclWatcher::PollOnce() {
  std::vector<Status> reports;
  {
    MutexLock lock(mu_);
    ++polls_;
    if (!fenced_ && options_.fenced) {
      Status fence = options_.fenced();
      if (!fence.ok()) {
        fenced_ = true;
        while (!comms_.empty()) AbortLocked(comms_.begin()->first, "fenced: " + fence.message());
      }
    }
    std::vector<std::pair<NcclComm, std::string>> failed;
    for (const auto& [comm, label] : comms_) {
      int result = kNcclSuccess;
      Status polled = api_.get_async_error(comm, &result);
      if (!polled.ok()) {
        failed.emplace_back(comm, Describe(comm, label) + ": " + polled.message());
      } else if (result != kNcclSuccess && result != kNcclInProgress) {
        failed.emplace_back(
            comm, Describe(comm, label) + ": asynchronous error " + api_.error_string(result));
      }
    }
    for (const auto& [comm, why] : failed) {
      reports.push_back(Unavailable(why));
      AbortLocked(comm, why);
    }
  }
  for (const Status& r : reports) {
    BATON_LOG(ERROR, kLog) << r.message();
    if (options_.report) options_.report(r);
  }
}

size_t NcclWatcher::watched() const {
  MutexLock lock(mu_);
  return comms_.size();
}

void NcclWatcher::Run() {
  MutexLock lock(mu_);
  while (!stop_) {
    const auto deadline = std::chrono::steady_clock::now() + options_.interval;
    while (!stop_) {
      if (wake_.WaitUntil(mu_, deadline) == std::cv_status::timeout) break;
    }
    if (stop_) break;
    lock.Unlock();
    PollOnce();
    lock.Lock();
  }
}

}  // namespace baton
