#include "controller/engines/peer_origin.h"

#include <algorithm>
#include <optional>
#include <vector>

#include "base/process/proc_table.h"
#include "controller/engines/engine_cgroup.h"

namespace baton {
namespace {

// True when `dir` is `cgroup` or a directory below it.
bool InCgroup(const std::string& dir, const std::string& cgroup) {
  if (cgroup.empty() || dir.size() < cgroup.size()) return false;
  if (dir.compare(0, cgroup.size(), cgroup) != 0) return false;
  return dir.size() == cgroup.size() || dir[cgroup.size()] == '/';
}

std::optional<uint64_t> Found(uint64_t id, const char* why, std::string* rule) {
  if (rule != nullptr) *rule = why;
  return id;
}

}  // namespace

std::optional<uint64_t> EngineOwning(pid_t pid, std::span<const EngineProcesses> engines,
                                     std::string* rule) {
  if (pid <= 0 || engines.empty()) return std::nullopt;
  const std::optional<ProcStat> stat = ReadProcStat(pid);
  if (!stat.has_value()) return std::nullopt;
  const std::string dir = Cgroup2DirOf(pid);
  for (const EngineProcesses& e : engines) {
    if (!dir.empty() && InCgroup(dir, e.cgroup)) return Found(e.id, "cgroup", rule);
  }
  for (const EngineProcesses& e : engines) {
    if (e.leader > 0 && stat->pgid == e.leader) return Found(e.id, "process group", rule);
  }
  std::vector<pid_t> line = Ancestors(pid);
  line.insert(line.begin(), pid);
  for (const EngineProcesses& e : engines) {
    if (e.leader > 0 && std::find(line.begin(), line.end(), e.leader) != line.end()) {
      return Found(e.id, "descendant", rule);
    }
  }
  return std::nullopt;
}

}  // namespace baton
