#include "base/build_info.h"

#include <cstdio>
#include <cstring>
#include <ctime>

namespace baton {
namespace build_values {
// cmake/build_info.cmake defines them in the generated build_info_values.cc.
extern const char kVersion[];
extern const char kCommit[];
extern const char kBuildType[];
}  // namespace build_values

const BuildInfo& GetBuildInfo() {
  static const BuildInfo info{build_values::kVersion, build_values::kCommit,
                              build_values::kBuildType};
  return info;
}

std::string VersionLine(std::string_view program) {
  const BuildInfo& b = GetBuildInfo();
  return std::string(program) + " " + std::string(b.version) + " (commit " + std::string(b.commit) +
         ", " + std::string(b.build_type) + ")";
}

bool WantsVersion(int argc, char** argv) {
  for (int i = 1; i < argc && std::strcmp(argv[i], "--") != 0; ++i) {
    if (std::strcmp(argv[i], "--version") == 0) return true;
  }
  return false;
}

namespace {

double UnixNow() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

// Taken when the program's static objects are made, before main().
const double kStartedAt = UnixNow();

}  // namespace

std::string ProcessInfoMetrics(std::string_view program) {
  const BuildInfo& b = GetBuildInfo();
  char start[64];
  std::snprintf(start, sizeof(start), "%.3f", kStartedAt);
  return "# HELP process_start_time_seconds Start time of the process since the Unix epoch\n"
         "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds " +
         std::string(start) +
         "\n# HELP baton_build_info The program, version, git commit and build type of this "
         "process; always 1\n# TYPE baton_build_info gauge\nbaton_build_info{program=\"" +
         std::string(program) + "\",version=\"" + std::string(b.version) + "\",commit=\"" +
         std::string(b.commit) + "\",build_type=\"" + std::string(b.build_type) + "\"} 1\n";
}

}  // namespace baton
