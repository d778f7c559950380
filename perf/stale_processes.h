// The check every benchmark makes before it measures: Baton processes that are not its own
// (left by an earlier run that was killed, or running for someone else) and what they hold
// that the benchmark needs: 2 MiB huge pages (a hugetlb memfd they keep open or map: a weight
// arena or a pool) and the models the benchmark loads (named on their command line, or a file
// of the model's folder open or mapped). Such processes skew every number (a weight arena
// that falls back to 4 KiB pages loads at a fraction of the speed), so the result says so in
// its JSON (`stale_processes`) and on stderr, loudly.
//
// A Baton process is one whose name or program starts with "baton" (the daemons, the engines,
// the keeper, the test engines). Plain functions reading /proc; thread-compatible.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace baton::perf {

struct StaleProcess {
  pid_t pid = 0;
  std::string name;
  std::string command;              // its command line, cut to 200 characters
  uint64_t huge_page_bytes = 0;     // of hugetlb files it holds open or maps
  std::vector<std::string> models;  // the wanted model folders it holds
};

struct StaleReport {
  std::vector<StaleProcess> processes;
  uint64_t huge_page_bytes = 0;  // distinct hugetlb files over all of them
  uint64_t free_huge_pages = 0;  // HugePages_Free of /proc/meminfo
  uint64_t total_huge_pages = 0;
  bool holds_models = false;
};

// The Baton processes of this machine outside this run (RunGuard's token) and outside the
// caller's ancestry; `model_dirs` are the folders the benchmark loads.
StaleReport FindStaleProcesses(const std::vector<std::string>& model_dirs);

// {"count", "huge_page_bytes", "holds_models", "free_huge_pages", "total_huge_pages",
//  "warning" (only when count > 0), "processes": [{"pid", "name", "command",
//  "huge_page_bytes", "models"}] (the first 20)}.
nlohmann::json StaleReportJson(const StaleReport& report);

// One loud paragraph on stderr when the report lists any process.
void WarnAboutStaleProcesses(const std::string& program, const StaleReport& report);

}  // namespace baton::perf
