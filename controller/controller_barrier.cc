// Controller: the barrier a fenced holder's blocks wait behind before they move on (to the
// successor, or back to free): every process of the engine gone, and on the CUDA backend
// NVML no longer listing any of them (docs/architecture.md, "Fencing").
#include <algorithm>

#include "base/log.h"
#include "controller/controller.h"

namespace baton {
namespace {

constexpr const char* kLog = "controller";

}  // namespace

Result<std::shared_ptr<EngineCgroup>> Controller::MakeCgroup(EngineId id) {
  if (cgroups_ == nullptr) return std::shared_ptr<EngineCgroup>();
  return cgroups_->Create(id);
}

std::vector<pid_t> Controller::EnginePids(const EngineRecord& e) const {
  std::vector<pid_t> pids = ProcessGroupMembers(e.process.pid());
  if (e.cgroup != nullptr) {
    for (pid_t pid : e.cgroup->Members()) {
      if (std::find(pids.begin(), pids.end(), pid) == pids.end()) pids.push_back(pid);
    }
  }
  if (std::find(pids.begin(), pids.end(), e.process.pid()) == pids.end()) {
    pids.push_back(e.process.pid());
  }
  return pids;
}

void Controller::HandOverBlocks(EngineId id, const std::optional<PendingFailover>& failover) {
  const LedgerEngine* le = ledger_->engine(id);
  const bool fenced = le != nullptr && le->role == LedgerRole::kFenced;
  if (failover.has_value()) {
    EngineRecord* s = Find(failover->successor);
    if (s != nullptr && s->live() && s->is(EngineState::kStandby)) {
      Status promoted = ledger_->Promote(s->id, failover->epoch);
      Result<std::vector<Extent>> moved = promoted.ok() ? ledger_->ReleaseAfterBarrier(id, s->id)
                                                        : Result<std::vector<Extent>>(promoted);
      if (moved.ok()) {
        SendPromote(*s, failover->epoch, *moved);
      } else {
        BATON_LOG(ERROR, kLog) << "handing blocks to engine " << s->id << ": "
                               << moved.status().ToString();
      }
    } else if (fenced) {
      (void)ledger_->ReleaseAfterBarrier(id);
    }
  } else if (fenced) {
    Result<std::vector<Extent>> freed = ledger_->ReleaseAfterBarrier(id);
    if (!freed.ok())
      BATON_LOG(ERROR, kLog) << "releasing engine " << id << ": " << freed.status().ToString();
  }
}

bool Controller::GpuStillLists(const std::vector<pid_t>& pids) {
  if (nvml_ == nullptr || device_ == nullptr || pids.empty()) return false;
  Result<std::vector<pid_t>> listed = nvml_->ComputePids(device_->pci_bus_id());
  if (!listed.ok()) {
    BATON_LOG(WARN, kLog) << "barrier: " << listed.status().message()
                          << "; going on with the reap as the barrier";
    return false;
  }
  for (pid_t pid : pids) {
    if (std::find(listed->begin(), listed->end(), pid) != listed->end()) return true;
  }
  return false;
}

void Controller::PassBarrierOrWait(BarrierWait wait) {
  const std::string held_by = BarrierHeldBy(wait);
  if (held_by.empty()) return HandOverBlocks(wait.old, wait.failover);
  BATON_LOG(WARN, kLog) << "engine " << wait.old << " (pid " << wait.pid << ") is reaped but "
                        << held_by << ": its blocks wait for the barrier";
  barrier_waits_[wait.old] = std::move(wait);
}

std::string Controller::BarrierHeldBy(const BarrierWait& w) {
  if (ProcessGroupAlive(w.pid)) return "another process of its group lives on";
  if (w.cgroup != nullptr && w.cgroup->Populated()) {
    return "another process of its cgroup lives on (" + w.cgroup->path() + ")";
  }
  std::vector<pid_t> pids = w.group_pids;
  if (std::find(pids.begin(), pids.end(), w.pid) == pids.end()) pids.push_back(w.pid);
  if (GpuStillLists(pids)) return "NVML still lists it on GPU " + device_->pci_bus_id();
  return "";
}

std::vector<EngineId> Controller::unfenced_reaped() const {
  std::vector<EngineId> ids;
  for (const auto& [id, holder] : unfenced_reaped_) ids.push_back(id);
  return ids;
}

// Reaped holders whose fence found no durable epoch, tried again (at most once a second, as
// each failed try spends a batch of epochs): fenced at a new epoch, then past the barrier
// like any other, so that their blocks return to the pool.
void Controller::RetryUnfencedHolders() {
  const TimePoint now = clock_.Now();
  if (unfenced_reaped_.empty() || now < next_unfenced_retry_) return;
  next_unfenced_retry_ = now + std::chrono::seconds(1);
  while (!unfenced_reaped_.empty()) {
    const auto [id, holder] = *unfenced_reaped_.begin();
    Result<uint64_t> epoch = AdvanceEpoch();
    if (!epoch.ok()) return;
    unfenced_reaped_.erase(unfenced_reaped_.begin());
    if (Status fenced = ledger_->Fence(id, *epoch); !fenced.ok()) {
      BATON_LOG(ERROR, kLog) << "fencing reaped engine " << id << ": " << fenced.ToString();
      continue;
    }
    BATON_LOG(INFO, kLog) << "reaped engine " << id << " fenced at epoch " << *epoch;
    BarrierWait wait{.old = id,
                     .pid = holder.pid,
                     .group_pids = {},
                     .cgroup = holder.cgroup,
                     .failover = std::nullopt,
                     .deadline = now + config_.gpu_release_timeout};
    PassBarrierOrWait(std::move(wait));
  }
}

void Controller::PollBarrierWaits() {
  std::vector<BarrierWait> ready;
  for (auto it = barrier_waits_.begin(); it != barrier_waits_.end();) {
    const bool holds = !BarrierHeldBy(it->second).empty();
    if (holds && clock_.Now() < it->second.deadline) {
      ++it;
      continue;
    }
    ready.push_back(it->second);
    ready.back().still_listed = holds;
    it = barrier_waits_.erase(it);
  }
  for (const BarrierWait& g : ready) FinishBarrierWait(g);
}

void Controller::FinishBarrierWait(const BarrierWait& g) {
  const bool listed = g.still_listed;
  const TimePoint now = clock_.Now();
  if (listed) {
    BATON_LOG(ERROR, kLog) << "barrier: engine " << g.old << " (pid " << g.pid
                           << "): another process of its group or cgroup is alive, or the GPU "
                           << "lists one, "
                           << "after "
                           << std::chrono::duration_cast<std::chrono::milliseconds>(
                                  config_.gpu_release_timeout)
                                  .count()
                           << " ms; every one was sent SIGKILL, so its blocks move on";
  } else if (nvml_ != nullptr) {
    BATON_LOG(INFO, kLog) << "barrier: NVML no longer lists pid " << g.pid
                          << " on the GPU and no process of its group is left; its blocks move on";
  } else {
    BATON_LOG(INFO, kLog) << "barrier: no process of engine " << g.old << "'s group (pid " << g.pid
                          << ")" << (g.cgroup != nullptr ? " or cgroup" : "")
                          << " is left; its blocks move on";
  }
  if (PromotionRecord* r = timelines_.current(); r != nullptr && g.failover.has_value()) {
    r->gpu_released = now;
  }
  HandOverBlocks(g.old, g.failover);
}

}  // namespace baton
