#include "controller/kept_memory.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

namespace baton {
namespace {

TEST(KeptMemoryTest, PoolManifestRoundTripsAndSaysWhyItDoesNotFit) {
  const PoolManifest m{.block_count = 16,
                       .block_bytes = 65536,
                       .bytes = 1 << 20,
                       .huge_pages = false,
                       .generation = 5};
  Result<PoolManifest> back = DecodePoolManifest(EncodePoolManifest(m), "pool");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, m);
  EXPECT_EQ(PoolMismatch(m, 16, 65536, 1 << 20), "");
  EXPECT_NE(PoolMismatch(m, 32, 65536, 1 << 20).find("the configuration wants 32"),
            std::string::npos);
  EXPECT_NE(PoolMismatch(m, 16, 65536, 4096).find("holds 4096 bytes"), std::string::npos);
  EXPECT_FALSE(DecodePoolManifest("{\"format\": 1}", "pool").ok());
  EXPECT_FALSE(DecodePoolManifest("[1,2", "pool").ok());
}

TEST(KeptMemoryTest, MemoryRecordIsWrittenAndReadBack) {
  char tmpl[] = "/tmp/baton-memrec-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string path = std::string(tmpl) + "/memory.json";
  Result<std::optional<MemoryRecord>> none = LoadMemoryRecord(path);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  ASSERT_TRUE(SaveMemoryRecord(path, {.weights_generation = 11, .pool_generation = 12}).ok());
  Result<std::optional<MemoryRecord>> back = LoadMemoryRecord(path);
  ASSERT_TRUE(back.ok() && back->has_value());
  EXPECT_EQ((*back)->weights_generation, 11u);
  EXPECT_EQ((*back)->pool_generation, 12u);
  std::ofstream(path) << "{\"weights_generation\": \"x\"}";
  Result<std::optional<MemoryRecord>> bad = LoadMemoryRecord(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("weights_generation"), std::string::npos);
  ::unlink(path.c_str());
  ::rmdir(tmpl);
  Result<uint64_t> g1 = NewGeneration(), g2 = NewGeneration();
  ASSERT_TRUE(g1.ok() && g2.ok());
  EXPECT_NE(*g1, 0u);
  EXPECT_NE(*g1, *g2);
}

}  // namespace
}  // namespace baton
