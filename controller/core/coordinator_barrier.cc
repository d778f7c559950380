// Coordinator: the barrier a fenced holder's blocks wait behind before they move on (to the
// successor, or back to free): every process of the engine gone, and on the CUDA backend
// NVML no longer listing any of them (docs/architecture.md, "Fencing rules").
#include "base/failpoint.h"
#include "base/log.h"
#include "controller/core/coordinator.h"

namespace baton {
namespace {

constexpr const char* kLog = "controller";

}  // namespace

void Coordinator::HandOverBlocks(EngineId id, const std::optional<PendingFailover>& failover) {
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
      if (Result<std::vector<Extent>> freed = ledger_->ReleaseAfterBarrier(id); !freed.ok()) {
        BATON_LOG(ERROR, kLog) << "releasing engine " << id << ": " << freed.status().ToString();
      }
    }
  } else if (fenced) {
    Result<std::vector<Extent>> freed = ledger_->ReleaseAfterBarrier(id);
    if (!freed.ok())
      BATON_LOG(ERROR, kLog) << "releasing engine " << id << ": " << freed.status().ToString();
  }
  SaveRoster();
}

void Coordinator::PassBarrierOrWait(BarrierWait wait) {
  BATON_FAILPOINT("mid_barrier");  // reaped and fenced; its blocks not yet past the barrier
  const std::string held_by = effects_.BarrierHeldBy(wait.old);
  if (held_by.empty()) return HandOverBlocks(wait.old, wait.failover);
  BATON_LOG(WARN, kLog) << "engine " << wait.old << " (pid " << wait.pid << ") is reaped but "
                        << held_by << ": its blocks wait for the barrier";
  barrier_waits_[wait.old] = std::move(wait);
}

// Reaped holders whose fence found no durable epoch, tried again (at most once a second, as
// each failed try spends a batch of epochs): fenced at a new epoch, then past the barrier
// like any other, so that their blocks return to the pool.
void Coordinator::RetryUnfencedHolders() {
  const TimePoint now = clock_.Now();
  if (unfenced_reaped_.empty() || now < next_unfenced_retry_) return;
  next_unfenced_retry_ = now + std::chrono::seconds(1);
  while (!unfenced_reaped_.empty()) {
    const auto [id, pid] = *unfenced_reaped_.begin();
    Result<uint64_t> epoch = AdvanceEpoch();
    if (!epoch.ok()) return;
    unfenced_reaped_.erase(unfenced_reaped_.begin());
    if (Status fenced = ledger_->Fence(id, *epoch); !fenced.ok()) {
      BATON_LOG(ERROR, kLog) << "fencing reaped engine " << id << ": " << fenced.ToString();
      ReleaseIfDone(id);
      continue;
    }
    BATON_LOG(INFO, kLog) << "reaped engine " << id << " fenced at epoch " << *epoch;
    PassBarrierOrWait(BarrierWait{.old = id,
                                  .pid = pid,
                                  .failover = std::nullopt,
                                  .deadline = now + config_.gpu_release_timeout});
    ReleaseIfDone(id);
  }
}

void Coordinator::PollBarrierWaits() {
  std::vector<std::pair<BarrierWait, bool>> ready;
  for (auto it = barrier_waits_.begin(); it != barrier_waits_.end();) {
    const bool holds = !effects_.BarrierHeldBy(it->first).empty();
    if (holds && clock_.Now() < it->second.deadline) {
      ++it;
      continue;
    }
    ready.emplace_back(it->second, holds);
    it = barrier_waits_.erase(it);
  }
  for (const auto& [wait, timed_out] : ready) FinishBarrierWait(wait, timed_out);
}

void Coordinator::FinishBarrierWait(const BarrierWait& g, bool timed_out) {
  if (timed_out) {
    BATON_LOG(ERROR, kLog) << "barrier: engine " << g.old << " (pid " << g.pid
                           << "): another process of its group or cgroup is alive, or the GPU "
                           << "lists one, after "
                           << std::chrono::duration_cast<std::chrono::milliseconds>(
                                  config_.gpu_release_timeout)
                                  .count()
                           << " ms; every one was sent SIGKILL, so its blocks move on";
  } else if (cuda_backend_) {
    BATON_LOG(INFO, kLog) << "barrier: NVML no longer lists pid " << g.pid
                          << " on the GPU and no process of its group is left; its blocks move on";
  } else {
    BATON_LOG(INFO, kLog) << "barrier: no process of engine " << g.old << "'s group (pid " << g.pid
                          << ") or cgroup is left; its blocks move on";
  }
  if (PromotionRecord* r = timelines_.current(); r != nullptr && g.failover.has_value()) {
    r->gpu_released = clock_.Now();
  }
  HandOverBlocks(g.old, g.failover);
  ReleaseIfDone(g.old);
}

void Coordinator::ReleaseIfDone(EngineId id) {
  if (engines_.count(id) != 0 || barrier_waits_.count(id) != 0 || unfenced_reaped_.count(id) != 0) {
    return;
  }
  effects_.Release(id);
}

}  // namespace baton
