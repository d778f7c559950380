#include "standby/kernels/huge_buffer.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

namespace baton {
namespace {

// The smaps block of the mapping that contains `p`.
std::string SmapsOf(const void* p) {
  const uintptr_t addr = reinterpret_cast<uintptr_t>(p);
  std::ifstream in("/proc/self/smaps");
  std::string line, block;
  bool inside = false;
  while (std::getline(in, line)) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-') {
      if (inside) break;
      inside = addr >= lo && addr < hi;
    }
    if (inside) block += line + "\n";
  }
  return block;
}

bool ThpOff() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string mode;
  std::getline(in, mode);
  return mode.empty() || mode.find("[never]") != std::string::npos;
}

TEST(HugeBufferTest, LargeBuffersAreHugePageAlignedAndAdvised) {
  HugeVector<float> v(3 << 20);  // 12 MiB
  ASSERT_EQ(reinterpret_cast<uintptr_t>(v.data()) % (2u << 20), 0u);
  for (size_t i = 0; i < v.size(); i += 1024) v[i] = static_cast<float>(i);
  EXPECT_EQ(v[3 << 19], static_cast<float>(3 << 19));
  const std::string smaps = SmapsOf(v.data());
  ASSERT_FALSE(smaps.empty());
  if (ThpOff()) GTEST_SKIP() << "transparent huge pages are off here";
  const size_t eligible = smaps.find("THPeligible:");
  ASSERT_NE(eligible, std::string::npos) << smaps;
  EXPECT_EQ(std::stoi(smaps.substr(eligible + 12)), 1) << smaps;
  EXPECT_NE(smaps.find(" hg"), std::string::npos) << "VmFlags without hg (MADV_HUGEPAGE)\n"
                                                  << smaps;
}

TEST(HugeBufferTest, GrowingKeepsTheContentAndSmallBuffersWork) {
  HugeVector<float> v(10);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data()) % 64, 0u);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  v.resize(1 << 20);  // 4 MiB of floats: past kHugeBufferMinBytes
  for (size_t i = 0; i < 10; ++i) EXPECT_EQ(v[i], static_cast<float>(i));
  EXPECT_EQ(v.back(), 0.0f);
  v.resize(5);
  v.shrink_to_fit();
  EXPECT_EQ(v[4], 4.0f);
}

}  // namespace
}  // namespace baton
