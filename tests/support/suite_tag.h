// The test suite's tag: BATON_TEST_RUN, a value unique to one run of the suite that every
// process the suite starts inherits (proc_table.h), so that the suite's last test
// (suite_leftovers_main.cc) finds what outlived it and nothing of another run on the machine.
// `make test` sets it afresh for each ctest; a ctest run by hand gets it from the first test
// binary that finds it unset under ctest: "ctest.<ctest's pid>.<its start time>", which every
// test of that ctest derives alike. Header-only; main() only.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "base/process/proc_table.h"

namespace baton::testing_support {

inline constexpr const char* kSuiteTagVariable = "BATON_TEST_RUN";

// The suite's tag for this process: the environment's, else its ctest parent's; "" when
// neither (a test binary run by hand).
inline std::string SuiteTag() {
  if (const char* tag = std::getenv(kSuiteTagVariable); tag != nullptr && *tag != '\0') return tag;
  const pid_t parent = ::getppid();
  if (ProcessName(parent) != "ctest") return "";
  std::ifstream in("/proc/" + std::to_string(parent) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return "";
  // Field 22, the start time, is the 20th after the name.
  size_t at = paren + 2;
  for (int field = 3; field < 22 && at != std::string::npos; ++field) {
    at = stat.find(' ', at);
    if (at != std::string::npos) ++at;
  }
  if (at == std::string::npos) return "";
  return "ctest." + std::to_string(parent) + "." + stat.substr(at, stat.find(' ', at) - at);
}

// Puts the suite's tag into this process's environment, for the processes it starts.
inline void ExportSuiteTag() {
  const std::string tag = SuiteTag();
  if (!tag.empty()) ::setenv(kSuiteTagVariable, tag.c_str(), 1);
}

}  // namespace baton::testing_support
