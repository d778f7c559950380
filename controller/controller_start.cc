// Controller: what a previous controller of this state directory left (its roster), found at
// start-up: which of its engines still run, as the pids and start times it recorded.
#include <unistd.h>

#include <cerrno>
#include <set>

#include "base/log.h"
#include "controller/controller.h"

namespace baton {
namespace {

constexpr const char* kLog = "controller";

}  // namespace

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

void Controller::AdoptHandle(const RosterEngine& r) {
  EngineHandle& h = handles_[r.id];
  h.id = r.id;
  h.pid = r.pid;
  h.start_time = r.start_time;
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
