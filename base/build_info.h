// BuildInfo: what a Baton binary was built from: the project's version (CMakeLists.txt), the
// git commit of its sources ("-dirty" when tracked files had uncommitted changes, "unknown"
// outside a git checkout) and the CMake build type. cmake/build_info.cmake reads them at every
// build, so a binary never names an older commit than its own.
//
// Every program answers --version with VersionLine(), and every daemon exports the gauge
// baton_build_info{program,version,commit,build_type} 1 and process_start_time_seconds (the
// Prometheus convention: alerts tell a restarted process by it). Constant data; thread-safe.
#pragma once

#include <string>
#include <string_view>

namespace baton {

struct BuildInfo {
  std::string_view version;
  std::string_view commit;
  std::string_view build_type;
};

const BuildInfo& GetBuildInfo();

// "baton-controller 0.1.0 (commit 79dd342a1b2c, Release)".
std::string VersionLine(std::string_view program);

// True when --version is among argv[1..] before a "--" (after it, the arguments are another
// program's: an engine command given to batonctl upgrade).
bool WantsVersion(int argc, char** argv);

// The Prometheus text of the gauges baton_build_info for `program` and
// process_start_time_seconds (the Unix time the program started).
std::string ProcessInfoMetrics(std::string_view program);

}  // namespace baton
