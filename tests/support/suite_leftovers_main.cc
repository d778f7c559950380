// baton_suite_leftovers: the test suite's last test (ctest's FIXTURES_CLEANUP of every other
// test). Fails when a process the suite started is still running: one whose start
// environment carries the suite's tag (suite_tag.h), other than this program and its
// ancestors (ctest, make) and what those started beside ctest. A process on its way out gets
// `kGrace` to go; what is left after that is listed, killed, and fails the test. Processes of other
// runs on the machine carry another tag and are never looked at. Without a tag (ctest not involved)
// it says so and is reported as skipped.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "base/process/proc_table.h"
#include "tests/support/suite_tag.h"

namespace {

constexpr auto kGrace = std::chrono::seconds(25);

// The tagged processes but this program, its ancestors (ctest, make, a shell) and their other
// children (what a shell started beside ctest with the tag exported: `... | tail`). A process
// a test left behind has ctest, nothing, or init (or a subreaper) above it.
std::vector<pid_t> Survivors(const std::string& tag) {
  const pid_t self = ::getpid();
  const pid_t ctest = ::getppid();
  std::vector<pid_t> exclude = baton::Ancestors(self);
  exclude.push_back(self);
  std::vector<pid_t> out;
  for (pid_t pid :
       baton::TaggedProcesses(baton::testing_support::kSuiteTagVariable, tag, exclude)) {
    const std::vector<pid_t> up = baton::Ancestors(pid);
    const bool beside_ctest =
        !up.empty() && up.front() != ctest && up.front() != 1 &&
        std::find(exclude.begin(), exclude.end(), up.front()) != exclude.end();
    if (!beside_ctest) out.push_back(pid);
  }
  return out;
}

}  // namespace

int main() {
  using baton::testing_support::kSuiteTagVariable;
  const std::string tag = baton::testing_support::SuiteTag();
  if (tag.empty()) {
    std::printf("SKIP: no %s and not run by ctest: the suite's processes cannot be told apart\n",
                kSuiteTagVariable);
    return 0;
  }
  const auto deadline = std::chrono::steady_clock::now() + kGrace;
  std::vector<pid_t> left = Survivors(tag);
  while (!left.empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    left = Survivors(tag);
  }
  if (left.empty()) {
    std::printf("no process of the suite (%s=%s) outlived it\n", kSuiteTagVariable, tag.c_str());
    return 0;
  }
  std::printf("%zu processes of the suite (%s=%s) outlived it; killing them:\n", left.size(),
              kSuiteTagVariable, tag.c_str());
  for (pid_t pid : left) {
    std::printf("  %d %s: %s\n", pid, baton::ProcessName(pid).c_str(),
                baton::ProcessCommandLine(pid).c_str());
    ::kill(pid, SIGKILL);
  }
  return 1;
}
