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

DeviceManifest SomeDevice() {
  return DeviceManifest{.generation = 9,
                        .weights_generation = 11,
                        .pool_generation = 12,
                        .device = 1,
                        .pci_bus_id = "0000:3B:00.0",
                        .block_count = 64,
                        .block_bytes = 2u << 20,
                        .weights = {.chunk_bytes = 256u << 20, .chunks = 40, .parts = 3},
                        .pool = {.chunk_bytes = 256u << 20, .chunks = 16, .parts = 1}};
}

TEST(KeptMemoryTest, DeviceManifestRoundTripsAndSaysWhyItDoesNotFit) {
  const DeviceManifest m = SomeDevice();
  Result<DeviceManifest> back = DecodeDeviceManifest(EncodeDeviceManifest(m), "device");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, m);
  DeviceManifest now = m;
  now.generation = 0;  // not compared: the record's check
  now.weights = now.pool = {};
  EXPECT_EQ(DeviceMismatch(m, now), "");
  const auto refused = [&](auto change, const std::string& says) {
    DeviceManifest other = now;
    change(other);
    const std::string why = DeviceMismatch(m, other);
    EXPECT_NE(why.find(says), std::string::npos) << why;
  };
  refused([](DeviceManifest& o) { o.weights_generation = 1; }, "other host weights");
  refused([](DeviceManifest& o) { o.pool_generation = 1; }, "another host pool");
  refused([](DeviceManifest& o) { o.device = 0; }, "this controller uses device 0");
  refused([](DeviceManifest& o) { o.pci_bus_id = "0000:86:00.0"; }, "0000:86:00.0");
  refused([](DeviceManifest& o) { o.block_count = 32; }, "the configuration wants 32");
  DeviceManifest torn = m;
  torn.weights.parts = 2;  // 40 chunks take 3 parts of 16
  EXPECT_NE(DeviceMismatch(torn, now).find("do not agree"), std::string::npos);
  EXPECT_FALSE(DecodeDeviceManifest("{\"format\": 1, \"generation\": 9}", "device").ok());
  EXPECT_FALSE(DecodeDeviceManifest("{\"format\": 2}", "device").ok());
  EXPECT_EQ(DevicePartName("pool", 3), "device.pool.3");
}

TEST(KeptMemoryTest, DevicePartManifestRoundTrips) {
  const DevicePartManifest p{.generation = 9, .part = 2, .first_chunk = 32, .chunks = 8};
  Result<DevicePartManifest> back = DecodeDevicePartManifest(EncodeDevicePartManifest(p), "part");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, p);
  EXPECT_FALSE(DecodeDevicePartManifest("{}", "part").ok());
}

TEST(KeptMemoryTest, ARecordWithoutADeviceGenerationReadsAsNoneKept) {
  char tmpl[] = "/tmp/baton-memrec-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string path = std::string(tmpl) + "/memory.json";
  std::ofstream(path) << "{\"weights_generation\": 11, \"pool_generation\": 12}";
  Result<std::optional<MemoryRecord>> old = LoadMemoryRecord(path);
  ASSERT_TRUE(old.ok() && old->has_value()) << old.status().ToString();
  EXPECT_EQ(**old, (MemoryRecord{.weights_generation = 11, .pool_generation = 12}));
  const MemoryRecord r{.weights_generation = 11, .pool_generation = 12, .device_generation = 13};
  ASSERT_TRUE(SaveMemoryRecord(path, r).ok());
  Result<std::optional<MemoryRecord>> back = LoadMemoryRecord(path);
  ASSERT_TRUE(back.ok() && back->has_value());
  EXPECT_EQ(**back, r);
  std::ofstream(path) << "{\"weights_generation\": 1, \"pool_generation\": 2, "
                         "\"device_generation\": \"x\"}";
  EXPECT_FALSE(LoadMemoryRecord(path).ok()) << "present but mistyped is refused";
  ::unlink(path.c_str());
  ::rmdir(tmpl);
}

}  // namespace
}  // namespace baton
