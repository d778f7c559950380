// The main() of every GoogleTest binary of Baton: the suite's tag (suite_tag.h) and a
// RunGuard (base/process/run_guard.h), so that no process a test starts outlives the test's
// process, whether the test passes, fails, or is killed at its time limit; a bug (base/bug.h)
// aborts the test, in this process and in every daemon it starts (BATON_ABORT_ON_BUG=1); then
// the tests.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "base/bug.h"
#include "base/process/run_guard.h"
#include "tests/support/suite_tag.h"

int main(int argc, char** argv) {
  bool listing = false;
  for (int i = 1; i < argc; ++i) {
    listing = listing || std::string_view(argv[i]).rfind("--gtest_list_tests", 0) == 0;
  }
  if (!listing) {  // ctest's discovery lists the tests and starts nothing
    baton::testing_support::ExportSuiteTag();
    if (baton::Status guarded = baton::RunGuard::Install("baton-test"); !guarded.ok()) {
      std::fprintf(stderr, "no run guard: %s\n", guarded.ToString().c_str());
      return 1;
    }
  }
  baton::SetAbortOnBug(true);
  ::setenv("BATON_ABORT_ON_BUG", "1", /*overwrite=*/1);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
