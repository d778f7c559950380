#include "weightcache/integrity.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

namespace baton {
namespace {

namespace fs = std::filesystem;

struct TestTensor {
  std::string name;
  std::string bytes;  // stored as U8 of this many elements
};

// Writes a safetensors file of U8 tensors.
void WriteSafetensors(const std::string& path, const std::vector<TestTensor>& tensors) {
  nlohmann::ordered_json header;
  uint64_t offset = 0;
  for (const TestTensor& t : tensors) {
    header[t.name] = {{"dtype", "U8"},
                      {"shape", {t.bytes.size()}},
                      {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  const std::string json = header.dump();
  std::ofstream out(path, std::ios::binary);
  char len[8];
  for (int i = 0; i < 8; ++i)
    len[i] = static_cast<char>(static_cast<uint64_t>(json.size()) >> (8 * i));
  out.write(len, 8);
  out << json;
  for (const TestTensor& t : tensors) out << t.bytes;
}

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

class IntegrityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "baton-integrity-XXXXXX";
    dir_ = ::mkdtemp(tmpl.data());
    tensors_ = {{"a", RandomBytes(5000, 1)}, {"b", RandomBytes(70000, 2)}, {"c", "xyz"}};
    WriteSafetensors(dir_ + "/model.safetensors", tensors_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  WeightCache Load() {
    auto cache = WeightCache::Load(dir_, {});
    EXPECT_TRUE(cache.ok()) << cache.status().ToString();
    return std::move(cache).value();
  }

  // Flips one byte of tensor `index`'s data in the file.
  void FlipByte(size_t index, size_t at) {
    const std::string path = dir_ + "/model.safetensors";
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    uint64_t header = 0;
    f.read(reinterpret_cast<char*>(&header), 8);
    uint64_t offset = 8 + header + at;
    for (size_t i = 0; i < index; ++i) offset += tensors_[i].bytes.size();
    f.seekg(static_cast<std::streamoff>(offset));
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x01);
    f.seekp(static_cast<std::streamoff>(offset));
    f.write(&c, 1);
  }

  std::string dir_;
  std::vector<TestTensor> tensors_;
};

TEST_F(IntegrityTest, HashesAreXxh3OfEachTensor) {
  WeightCache cache = Load();
  for (unsigned threads : {1u, 2u, 0u}) {
    IntegrityManifest m = HashTensors(cache, threads);
    EXPECT_EQ(m.algorithm, "xxh3_64");
    ASSERT_EQ(m.tensors.size(), 3u);
    for (const TestTensor& t : tensors_) {
      EXPECT_EQ(m.tensors[t.name], XXH3_64bits(t.bytes.data(), t.bytes.size())) << t.name;
    }
  }
}

TEST_F(IntegrityTest, ManifestRoundTripsThroughTheModelDirectory) {
  WeightCache cache = Load();
  const IntegrityManifest m = HashTensors(cache);
  ASSERT_TRUE(WriteManifest(dir_, m).ok());
  EXPECT_FALSE(fs::exists(dir_ + "/baton-integrity.json.tmp"));
  std::ifstream in(dir_ + "/baton-integrity.json");
  nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["algorithm"], "xxh3_64");
  EXPECT_EQ(j["tensors"]["c"], HashToHex(m.tensors.at("c")));
  EXPECT_EQ(j["tensors"]["c"].get<std::string>().size(), 16u);
  auto back = ReadManifest(dir_);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->tensors, m.tensors);
  // The manifest does not disturb loading: it is not a safetensors file.
  IntegrityReport report = Verify(Load(), *back);
  EXPECT_TRUE(report.ok()) << report.Summary();
  EXPECT_EQ(report.checked, 3u);
  EXPECT_EQ(report.Summary(), "ok: 3 tensors match");
}

TEST_F(IntegrityTest, DetectsAFlippedByte) {
  IntegrityManifest good = HashTensors(Load());
  FlipByte(1, 65432);
  IntegrityReport report = Verify(Load(), good);
  EXPECT_FALSE(report.ok());
  EXPECT_EQ(report.mismatched, std::vector<std::string>{"b"});
  EXPECT_TRUE(report.missing.empty());
  EXPECT_NE(report.Summary().find("1 mismatched: b"), std::string::npos) << report.Summary();
}

TEST_F(IntegrityTest, ReportsMissingAndUnexpectedTensors) {
  IntegrityManifest expected = HashTensors(Load());
  expected.tensors.erase("a");
  expected.tensors["ghost"] = 1;
  IntegrityReport report = Verify(Load(), expected);
  EXPECT_EQ(report.missing, std::vector<std::string>{"ghost"});
  EXPECT_EQ(report.unexpected, std::vector<std::string>{"a"});
  EXPECT_TRUE(report.mismatched.empty());
  EXPECT_FALSE(report.ok());
}

TEST(IntegrityManifestTest, HexRoundTrip) {
  EXPECT_EQ(HashToHex(0x0123456789abcdefull), "0123456789abcdef");
  EXPECT_EQ(HashToHex(1), "0000000000000001");
  EXPECT_EQ(*HexToHash("0123456789ABCDEF"), 0x0123456789abcdefull);
  EXPECT_FALSE(HexToHash("123").ok());
  EXPECT_FALSE(HexToHash("0123456789abcdeg").ok());
}

TEST(IntegrityManifestTest, RefusesMalformedManifests) {
  const char* bad[] = {
      "not json",
      "[]",
      R"({"tensors": {}})",
      R"({"algorithm": "sha256", "tensors": {}})",
      R"({"algorithm": "xxh3_64"})",
      R"({"algorithm": "xxh3_64", "tensors": {"a": 5}})",
      R"({"algorithm": "xxh3_64", "tensors": {"a": "12"}})",
  };
  for (const char* text : bad) {
    auto m = ManifestFromJson("m.json", text);
    ASSERT_FALSE(m.ok()) << text;
    EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument) << text;
    EXPECT_EQ(m.status().message().rfind("m.json: ", 0), 0u) << m.status().message();
  }
  auto unknown = ManifestFromJson("m.json", R"({"algorithm": "sha256", "tensors": {}})");
  EXPECT_NE(unknown.status().message().find("sha256"), std::string::npos);
  auto named = ManifestFromJson("m.json", R"({"algorithm": "xxh3_64", "tensors": {"w.q": "1"}})");
  EXPECT_NE(named.status().message().find("w.q"), std::string::npos);
  // A field the manifest does not have is refused, named, as the weight manifest's decoder
  // refuses one.
  auto extra = ManifestFromJson("m.json", R"({"algorithm": "xxh3_64", "tensors": {}, "extra": 1})");
  ASSERT_FALSE(extra.ok());
  EXPECT_EQ(extra.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(extra.status().message().find("field 'extra' is not a field of the integrity manifest"),
            std::string::npos)
      << extra.status().message();
  // A tensor listed twice (the last would win, hiding a wrong first hash) is refused.
  auto twice =
      ManifestFromJson("m.json", R"({"algorithm": "xxh3_64", "tensors": {"w": "0000000000000000",)"
                                 R"( "w": "0123456789abcdef"}})");
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().message().find("'w' appears twice"), std::string::npos)
      << twice.status().message();
}

TEST(IntegrityManifestTest, MissingManifestSaysHowToMakeOne) {
  auto m = ReadManifest("/nonexistent-baton-dir");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kNotFound);
  EXPECT_NE(m.status().message().find("baton-weights hash"), std::string::npos);
}

}  // namespace
}  // namespace baton
