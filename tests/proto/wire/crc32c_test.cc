#include "proto/wire/crc32c.h"

#include <gtest/gtest.h>

#include <string>

namespace baton::proto {
namespace {

TEST(Crc32cTest, StandardCheckValue) { EXPECT_EQ(Crc32c("123456789"), 0xE3069283u); }

TEST(Crc32cTest, EmptyInputIsZero) { EXPECT_EQ(Crc32c(std::string_view()), 0u); }

// Test vectors from RFC 3720 (iSCSI), appendix B.4.
TEST(Crc32cTest, Rfc3720Vectors) {
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  std::string ascending(32, '\0');
  for (int i = 0; i < 32; ++i) ascending[i] = static_cast<char>(i);
  EXPECT_EQ(Crc32c(ascending), 0x46DD794Eu);
}

TEST(Crc32cTest, ExtendEqualsOneShot) {
  const std::string data = "the quick brown fox jumps over the lazy dog, twice over";
  for (size_t split = 0; split <= data.size(); ++split) {
    const uint32_t head = Crc32c(data.data(), split);
    EXPECT_EQ(Crc32cExtend(head, data.data() + split, data.size() - split), Crc32c(data))
        << "split at " << split;
  }
}

TEST(Crc32cTest, DetectsSingleBitFlip) {
  std::string data(1000, 'a');
  const uint32_t clean = Crc32c(data);
  data[500] ^= 0x01;
  EXPECT_NE(Crc32c(data), clean);
}

}  // namespace
}  // namespace baton::proto
