#include "base/process/proc_table.h"

#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string_view>

namespace baton {
namespace {

std::string ReadProcFile(pid_t pid, const char* file) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/" + file, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace

std::vector<pid_t> ListPids() {
  std::vector<pid_t> pids;
  DIR* dir = ::opendir("/proc");
  if (dir == nullptr) return pids;
  while (const dirent* e = ::readdir(dir)) {
    pid_t pid = 0;
    const char* end = e->d_name + std::char_traits<char>::length(e->d_name);
    auto [p, ec] = std::from_chars(e->d_name, end, pid);
    if (ec == std::errc() && p == end && pid > 0) pids.push_back(pid);
  }
  ::closedir(dir);
  return pids;
}

std::optional<std::string> StartEnvironValue(pid_t pid, std::string_view name) {
  const std::string env = ReadProcFile(pid, "environ");
  size_t start = 0;
  while (start < env.size()) {
    size_t end = env.find('\0', start);
    if (end == std::string::npos) end = env.size();
    const std::string_view entry(env.data() + start, end - start);
    if (entry.size() > name.size() && entry.substr(0, name.size()) == name &&
        entry[name.size()] == '=') {
      return std::string(entry.substr(name.size() + 1));
    }
    start = end + 1;
  }
  return std::nullopt;
}

bool HasToken(std::string_view list, std::string_view token) {
  if (token.empty()) return false;
  size_t start = 0;
  while (start <= list.size()) {
    size_t end = list.find(':', start);
    if (end == std::string_view::npos) end = list.size();
    if (list.substr(start, end - start) == token) return true;
    start = end + 1;
  }
  return false;
}

std::vector<pid_t> TaggedProcesses(std::string_view name, std::string_view token,
                                   const std::vector<pid_t>& exclude) {
  std::vector<pid_t> out;
  for (pid_t pid : ListPids()) {
    bool excluded = false;
    for (pid_t x : exclude) excluded = excluded || x == pid;
    if (excluded) continue;
    const std::optional<std::string> value = StartEnvironValue(pid, name);
    if (value.has_value() && HasToken(*value, token)) out.push_back(pid);
  }
  return out;
}

std::optional<ProcStat> ReadProcStat(pid_t pid) {
  const std::string stat = ReadProcFile(pid, "stat");
  const size_t paren = stat.rfind(')');  // the name may hold spaces and parentheses
  ProcStat out;
  unsigned long long start = 0;
  // After the name: state, ppid, pgrp, then 16 fields up to the start time (field 22).
  if (paren == std::string::npos ||
      std::sscanf(stat.c_str() + paren + 1,
                  " %c %d %d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu",
                  &out.state, &out.ppid, &out.pgid, &start) != 4) {
    return std::nullopt;
  }
  out.start_ticks = start;
  return out;
}

std::vector<pid_t> Ancestors(pid_t pid) {
  std::vector<pid_t> out;
  for (int depth = 0; depth < 4096 && pid > 1; ++depth) {
    const std::optional<ProcStat> stat = ReadProcStat(pid);
    if (!stat.has_value() || stat->ppid <= 0) break;
    pid = stat->ppid;
    out.push_back(pid);
  }
  return out;
}

std::string ProcessName(pid_t pid) {
  std::string name = ReadProcFile(pid, "comm");
  while (!name.empty() && name.back() == '\n') name.pop_back();
  return name;
}

std::string ProcessCommandLine(pid_t pid) {
  std::string line = ReadProcFile(pid, "cmdline");
  while (!line.empty() && line.back() == '\0') line.pop_back();
  for (char& c : line) {
    if (c == '\0') c = ' ';
  }
  return line;
}

bool ProcessPresent(pid_t pid) { return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM); }

bool ProcessRunning(pid_t pid) {
  if (pid <= 0) return false;
  const std::optional<ProcStat> stat = ReadProcStat(pid);
  return stat.has_value() && stat->state != 'Z' && stat->state != 'X';
}

std::string ProcessProgram(pid_t pid) {
  if (pid <= 0) return "";
  const std::string link = "/proc/" + std::to_string(pid) + "/exe";
  char buf[4096];
  const ssize_t n = ::readlink(link.c_str(), buf, sizeof(buf));
  if (n <= 0 || static_cast<size_t>(n) >= sizeof(buf)) return "";
  std::string path(buf, static_cast<size_t>(n));
  constexpr std::string_view kDeleted = " (deleted)";
  if (path.ends_with(kDeleted)) path.resize(path.size() - kDeleted.size());
  return path;
}

bool ConnectedProcessGone(pid_t pid, int pidfd) {
  if (pid <= 0 || !ProcessRunning(pid)) return true;
  if (pidfd < 0) return false;
  pollfd p{.fd = pidfd, .events = POLLIN, .revents = 0};
  return ::poll(&p, 1, 0) != 0;  // readable once it exited; an error counts as gone
}

}  // namespace baton
