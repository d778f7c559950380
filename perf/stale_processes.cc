#include "perf/stale_processes.h"

#include <dirent.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <utility>

#include "base/process/proc_table.h"
#include "base/process/run_guard.h"

namespace baton::perf {
namespace {

bool IsBatonProcess(pid_t pid) {
  if (ProcessName(pid).rfind("baton", 0) == 0) return true;
  const std::string command = ProcessCommandLine(pid);
  // A script engine (python3 .../baton-torch-engine): its first two words.
  const size_t first = command.find(' ');
  for (const std::string& word :
       {command.substr(0, first),
        first == std::string::npos ? std::string() : command.substr(first + 1)}) {
    const std::string w = word.substr(0, word.find(' '));
    const size_t slash = w.rfind('/');
    if (w.substr(slash == std::string::npos ? 0 : slash + 1).rfind("baton", 0) == 0) return true;
  }
  return false;
}

// Every file `pid` holds: its open fds and its mapped files, as /proc paths to stat.
std::vector<std::string> HeldFiles(pid_t pid) {
  std::vector<std::string> out;
  const std::string base = "/proc/" + std::to_string(pid);
  for (const char* sub : {"/fd", "/map_files"}) {
    DIR* dir = ::opendir((base + sub).c_str());
    if (dir == nullptr) continue;
    while (const dirent* e = ::readdir(dir)) {
      if (e->d_name[0] != '.') out.push_back(base + sub + "/" + e->d_name);
    }
    ::closedir(dir);
  }
  return out;
}

std::string LinkTarget(const std::string& path) {
  char buf[4096];
  const ssize_t n = ::readlink(path.c_str(), buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
}

bool Under(const std::string& path, const std::string& dir) {
  return !dir.empty() && path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 &&
         path[dir.size()] == '/';
}

void ReadMeminfo(StaleReport* report) {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t value = 0;
  while (in >> key >> value) {
    if (key == "HugePages_Total:") report->total_huge_pages = value;
    if (key == "HugePages_Free:") report->free_huge_pages = value;
    in.ignore(256, '\n');
  }
}

}  // namespace

StaleReport FindStaleProcesses(const std::vector<std::string>& model_dirs) {
  StaleReport report;
  ReadMeminfo(&report);
  std::vector<pid_t> mine = Ancestors(::getpid());
  mine.push_back(::getpid());
  mine.push_back(RunGuard::reaper());
  std::set<std::pair<dev_t, ino_t>> counted;
  for (pid_t pid : ListPids()) {
    bool skip = false;
    for (pid_t m : mine) skip = skip || m == pid;
    const std::optional<std::string> tag = StartEnvironValue(pid, kRunGuardVariable);
    if (skip || (tag.has_value() && HasToken(*tag, RunGuard::token())) || !IsBatonProcess(pid)) {
      continue;
    }
    StaleProcess p{.pid = pid,
                   .name = ProcessName(pid),
                   .command = ProcessCommandLine(pid).substr(0, 200),
                   .huge_page_bytes = 0,
                   .models = {}};
    std::set<std::pair<dev_t, ino_t>> own;
    std::set<std::string> models;
    for (const std::string& file : HeldFiles(pid)) {
      struct stat st {};
      struct statfs fs {};
      if (::stat(file.c_str(), &st) == 0 && ::statfs(file.c_str(), &fs) == 0 &&
          static_cast<unsigned long>(fs.f_type) == HUGETLBFS_MAGIC) {
        const uint64_t bytes = static_cast<uint64_t>(st.st_blocks) * 512;
        if (own.insert({st.st_dev, st.st_ino}).second) p.huge_page_bytes += bytes;
        if (counted.insert({st.st_dev, st.st_ino}).second) report.huge_page_bytes += bytes;
      }
      const std::string target = LinkTarget(file);
      for (const std::string& dir : model_dirs) {
        if (Under(target, dir)) models.insert(dir);
      }
    }
    for (const std::string& dir : model_dirs) {
      if (!dir.empty() && p.command.find(dir) != std::string::npos) models.insert(dir);
    }
    p.models.assign(models.begin(), models.end());
    report.holds_models = report.holds_models || !p.models.empty();
    report.processes.push_back(std::move(p));
  }
  return report;
}

nlohmann::json StaleReportJson(const StaleReport& report) {
  nlohmann::json processes = nlohmann::json::array();
  for (size_t i = 0; i < report.processes.size() && i < 20; ++i) {
    const StaleProcess& p = report.processes[i];
    processes.push_back({{"pid", p.pid},
                         {"name", p.name},
                         {"command", p.command},
                         {"huge_page_bytes", p.huge_page_bytes},
                         {"models", p.models}});
  }
  nlohmann::json j = {{"count", report.processes.size()},
                      {"huge_page_bytes", report.huge_page_bytes},
                      {"holds_models", report.holds_models},
                      {"free_huge_pages", report.free_huge_pages},
                      {"total_huge_pages", report.total_huge_pages},
                      {"processes", processes}};
  if (!report.processes.empty()) {
    j["warning"] =
        std::to_string(report.processes.size()) +
        " Baton processes of another run were running when this one started" +
        (report.huge_page_bytes > 0
             ? ", holding " + std::to_string(report.huge_page_bytes >> 20) + " MiB of huge pages"
             : "") +
        (report.holds_models ? ", holding the models it loads" : "") +
        ": its numbers may not be this machine's";
  }
  return j;
}

void WarnAboutStaleProcesses(const std::string& program, const StaleReport& report) {
  if (report.processes.empty()) return;
  std::fprintf(stderr, "%s: WARNING: %s\n", program.c_str(),
               StaleReportJson(report)["warning"].get<std::string>().c_str());
  for (const StaleProcess& p : report.processes) {
    std::fprintf(stderr, "  %d %s (%llu MiB of huge pages%s%s): %s\n", p.pid, p.name.c_str(),
                 static_cast<unsigned long long>(p.huge_page_bytes >> 20),
                 p.models.empty() ? "" : ", holds ", p.models.empty() ? "" : p.models[0].c_str(),
                 p.command.c_str());
  }
}

}  // namespace baton::perf
