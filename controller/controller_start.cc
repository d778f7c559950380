// Controller: what a previous controller of this state directory left (its roster), found at
// start-up: which of its engines still run, as the pids and start times it recorded.
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <set>
#include <thread>
#include <vector>

#include "base/io/unique_fd.h"
#include "base/log.h"
#include "base/process/file_holders.h"
#include "base/process/proc_table.h"
#include "controller/controller.h"
#include "controller/engines/child_process.h"
#include "controller/keeper/keeper_client.h"

namespace baton {
namespace {

constexpr const char* kLog = "controller";
// How long the kept memory's unaccounted holders may take to exit once killed (a GPU
// engine's teardown takes 0.1-0.2 s).
constexpr Duration kHolderExitWait = std::chrono::seconds(5);

std::string PidList(const std::vector<pid_t>& pids) {
  std::string out;
  for (pid_t pid : pids) out += (out.empty() ? "" : " ") + std::to_string(pid);
  return out;
}

// SIGKILL to `pid` and, when it leads a process group that is not this one's, to the group.
void KillHolder(pid_t pid) {
  if (::getpgid(pid) == pid && pid != ::getpgrp()) (void)::kill(-pid, SIGKILL);
  (void)::kill(pid, SIGKILL);
}

// Waits until none of `pids` runs (a zombie has let its memory and files go) and every process
// group one of them led is empty, at most `wait`.
void AwaitExits(const std::vector<pid_t>& pids, Duration wait) {
  const auto deadline = std::chrono::steady_clock::now() + wait;
  for (pid_t pid : pids) {
    while ((ProcessRunning(pid) || ProcessGroupAlive(pid)) &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
}

}  // namespace

std::string Controller::ClearHoldersOfKeptMemory(bool weights, bool pool) {
  std::vector<FileId> files;
  if (pool) files.push_back(FileIdOf(pool_.fd()));
  if (weights) {
    Result<std::vector<UniqueFd>> arena = weights_->arena().DupFds();
    if (arena.ok()) {
      for (const UniqueFd& fd : *arena) files.push_back(FileIdOf(fd.get()));
    }
  }
  if (keeper_pid_ <= 0) {  // the keeper holds it too, and must not be taken for an engine
    return "baton-keeper's pid is unknown, so the processes that hold the kept memory cannot "
           "be told from it";
  }
  const std::vector<pid_t> mine = {::getpid(), keeper_pid_};
  const std::vector<pid_t> holders = ProcessesHolding(files, mine);
  if (holders.empty()) return "";
  BATON_LOG(WARN, kLog) << holders.size() << " processes hold the kept memory and no roster "
                        << "accounts for them (pids " << PidList(holders) << "): killed";
  for (pid_t pid : holders) KillHolder(pid);
  AwaitExits(holders, kHolderExitWait);
  found_.holders_killed.assign(holders.begin(), holders.end());
  const std::vector<pid_t> left = ProcessesHolding(files, mine);
  if (left.empty()) return "";
  const std::string why =
      "processes no roster accounts for still hold the kept memory (pids " + PidList(left) + ")";
  BATON_LOG(ERROR, kLog) << why << ": the pool is made anew";
  return why;
}

void Controller::FindPrevious() {
  found_.exec_at = started_at_;
  std::set<uint64_t> keep;
  Result<std::optional<Roster>> roster = roster_file_.Load();
  if (!roster.ok()) {
    found_.roster_refused = "refused: " + roster.status().message();
    BATON_LOG(ERROR, kLog) << "the previous controller's roster is refused ("
                           << roster.status().message()
                           << "): every engine it ran is unaccounted for";
  } else if (!roster->has_value()) {
    found_.roster_refused = "none";
  } else if ((*roster)->boot_id != BootId()) {
    found_.roster_refused = "of a previous boot";
    Roster next;
    next.incarnation = (*roster)->incarnation;
    next.next_engine_id = (*roster)->next_engine_id;
    found_.roster = next;  // no engine survives a reboot; ids and the count go on
  } else {
    found_.roster = **roster;
  }
  if (found_.roster.has_value()) {
    found_.incarnation = found_.roster->incarnation + 1;
    for (const RosterEngine& r : found_.roster->engines) {
      AdoptHandle(r);
      if (found_.alive[r.id]) keep.insert(r.id);
    }
  }
  // Processes a previous controller's engines left that nothing accounts for.
  if (cgroups_ != nullptr) cgroups_->ClearLeftovers(keep);
}

void Controller::LeaveAsFound(const Status& why) {
  std::string left;
  for (auto& [id, h] : handles_) {
    if (h.exited || h.process.pid() == 0) continue;
    left += (left.empty() ? "" : ", ") + std::string("engine ") + std::to_string(id) + " (pid " +
            std::to_string(h.pid) + ")";
    h.process.Release();
    if (h.cgroup != nullptr) h.cgroup->Leave();
  }
  if (!left.empty()) {
    if (cgroups_ != nullptr) cgroups_->Leave();
    BATON_LOG(WARN, kLog) << "cannot start (" << why.message() << "): " << left
                          << " of the previous controller left running for the next one";
    return;
  }
  // Only a controller that got as far as owning the state directory (its journal's lock) may
  // touch the keeper: another may be running there.
  if (!config_.keep_memory || !journal_.has_value()) return;
  // Nothing runs that maps kept memory: a keeper that keeps nothing is let go.
  Result<KeeperClient> keeper = KeeperClient::Connect(config_.keeper_socket_path(), "", "");
  if (!keeper.ok()) return;
  Result<std::optional<KeptItem>> weights = keeper->Fetch("weights");
  Result<std::optional<KeptItem>> pool = keeper->Fetch("pool");
  if (weights.ok() && !weights->has_value() && pool.ok() && !pool->has_value()) {
    (void)keeper->Release("");
    BATON_LOG(INFO, kLog) << "baton-keeper keeps nothing: let go";
  }
}

void Controller::AdoptHandle(const RosterEngine& r) {
  EngineHandle& h = handles_[r.id];
  h.id = r.id;
  h.pid = r.pid;
  h.start_time = r.start_time;
  h.device_memory = r.device_memory;
  if (cgroups_ != nullptr && !r.cgroup.empty()) {
    Result<std::shared_ptr<EngineCgroup>> cgroup = cgroups_->Adopt(r.cgroup);
    if (cgroup.ok()) {
      h.cgroup = std::move(cgroup).value();
    } else {
      BATON_LOG(WARN, kLog) << "engine " << r.id << ": " << cgroup.status().message()
                            << "; its process group is fenced without it";
    }
  }
  Result<ChildProcess> process = ChildProcess::Adopt(r.pid, r.start_time);
  if (!process.ok()) {
    BATON_LOG(WARN, kLog) << "engine " << r.id
                          << " of the previous controller: " << process.status().message();
    found_.alive[r.id] = false;
    h.exited = true;
    return;
  }
  h.process = std::move(process).value();
  Result<std::optional<ExitInfo>> exited = h.process.TryReap();
  found_.alive[r.id] = exited.ok() && !exited->has_value();
  if (!found_.alive[r.id]) h.exited = true;
  BATON_LOG(INFO, kLog) << "engine " << r.id << " (pid " << r.pid << ", " << ToString(r.role)
                        << ") of the previous controller "
                        << (found_.alive[r.id] ? "is running" : "has exited");
}

}  // namespace baton
