#include "standby/kernels/kernels_choice.h"

#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>

#include <string>
#include <vector>

#include "standby/kernels/kernels.h"
#include "standby/kernels/kernels_gemm.h"

extern char** environ;

namespace baton {
namespace {

TEST(KernelsChoice, ParsesTheEnvironmentsValues) {
  EXPECT_EQ(ParseKernelsAsked(nullptr), KernelsAsked::kBest);
  EXPECT_EQ(ParseKernelsAsked(""), KernelsAsked::kBest);
  EXPECT_EQ(ParseKernelsAsked("auto"), KernelsAsked::kBest);
  EXPECT_EQ(ParseKernelsAsked("avx2"), KernelsAsked::kAvx2);
  EXPECT_EQ(ParseKernelsAsked("portable"), KernelsAsked::kPortable);
  testing::internal::CaptureStderr();
  EXPECT_EQ(ParseKernelsAsked("AVX-512"), KernelsAsked::kBest);
  EXPECT_NE(testing::internal::GetCapturedStderr().find(
                "BATON_CPU_KERNELS=AVX-512 is not a kernel choice (auto, avx2 or portable)"),
            std::string::npos);
}

// What the process started with follows what the environment asked for (a run of the suite
// with BATON_CPU_KERNELS set computes on that path throughout).
TEST(KernelsChoice, StartupFollowsTheEnvironment) {
  const KernelsAsked asked = KernelsAskedByEnvironment();
  if (asked == KernelsAsked::kPortable) {
    EXPECT_EQ(ActiveKernelPath(), KernelPath::kPortable);
  }
  if (asked != KernelsAsked::kBest) {
    EXPECT_FALSE(Avx512BlocksInUse());
  }
  const std::string in_use = KernelsInUse();
  EXPECT_EQ(in_use.rfind(ActiveKernelPath() == KernelPath::kAvx2 ? "avx2" : "portable", 0), 0u)
      << in_use;
  EXPECT_EQ(in_use.find("avx-512") != std::string::npos, Avx512BlocksInUse()) << in_use;
  EXPECT_EQ(in_use.find("(BATON_CPU_KERNELS=") != std::string::npos, asked != KernelsAsked::kBest)
      << in_use;
}

// The test above in a process of its own started with `value`: its exit status.
int RunStartupTestWith(const std::string& value) {
  std::vector<std::string> env{"BATON_CPU_KERNELS=" + value};
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::string(*e).rfind("BATON_CPU_KERNELS=", 0) != 0) env.emplace_back(*e);
  }
  std::vector<char*> envp;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string self = "/proc/self/exe", filter = "--gtest_filter=KernelsChoice.Startup*";
  char* argv[] = {self.data(), filter.data(), nullptr};
  pid_t pid = 0;
  if (posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv, envp.data()) != 0) return -1;
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(KernelsChoice, EachChoiceIsTakenAtStartup) {
  for (const char* value : {"portable", "avx2", "auto"}) {
    EXPECT_EQ(RunStartupTestWith(value), 0) << "BATON_CPU_KERNELS=" << value;
  }
}

}  // namespace
}  // namespace baton
