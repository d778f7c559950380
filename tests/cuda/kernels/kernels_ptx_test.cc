// The embedded PTX: it names the three kernels and assembles for Hopper with the toolkit's
// ptxas (checked here, without a GPU, so a PTX mistake is caught before the one GPU run).
#include "cuda/kernels/kernels_ptx.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "tests/cuda/cuda_test_util.h"

namespace baton {
namespace {

TEST(KernelsPtxTest, NamesItsKernels) {
  const std::string ptx = kBatonKernelsPtx;
  EXPECT_NE(ptx.find(".version 7.0"), std::string::npos);
  EXPECT_NE(ptx.find(".target sm_70"), std::string::npos);
  for (const char* k : {kScrubHeadersKernel, kSpinKernel, kFillKernel}) {
    EXPECT_NE(ptx.find(std::string(".visible .entry ") + k + "("), std::string::npos) << k;
  }
}

TEST(KernelsPtxTest, FillPatternMatchesTheKernelsArithmetic) {
  EXPECT_EQ(FillPatternWord(0, 0), 0u);
  EXPECT_EQ(FillPatternWord(1, 0), 2654435761u);
  EXPECT_EQ(FillPatternWord(2, 7), static_cast<uint32_t>(2ull * 2654435761ull) ^ 7u);
  EXPECT_EQ(FillPatternWord((1ull << 32) + 1, 0), 2654435761u);  // the kernel keeps 32 bits
}

TEST(KernelsPtxTest, AssemblesForSm90AndSm100) {
  const std::string ptxas = testing::PtxasPath();
  if (::access(ptxas.c_str(), X_OK) != 0) GTEST_SKIP() << "no ptxas at " << ptxas;
  testing::TempDir dir;
  const std::string src = dir.File("kernels.ptx");
  std::ofstream(src) << kBatonKernelsPtx;
  for (const char* arch : {"sm_90", "sm_100"}) {
    const std::string cmd = ptxas + " -arch=" + arch + " " + src + " -o " + dir.File("k.cubin") +
                            " > " + dir.File("ptxas.log") + " 2>&1";
    const int rc = std::system(cmd.c_str());
    std::ifstream log(dir.File("ptxas.log"));
    const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    EXPECT_EQ(rc, 0) << arch << ": " << text;
  }
}

}  // namespace
}  // namespace baton
