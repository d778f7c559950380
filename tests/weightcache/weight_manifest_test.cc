#include "weightcache/weight_manifest.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "tests/weightcache/safetensors_testutil.h"
#include "weightcache/weight_cache.h"

namespace baton {
namespace {

namespace fs = std::filesystem;
using testutil::TempDir;
using testutil::ValidSafetensors;

constexpr char kShard1[] = "model-00001-of-00002.safetensors";
constexpr char kShard2[] = "model-00002-of-00002.safetensors";
constexpr char kIndex[] = "model.safetensors.index.json";

// Two shards and an index; a holds F32 [16, 16], b U8 [1000], c BF16 [3, 5].
void WriteIndexedModel(const TempDir& dir) {
  dir.Write(kShard1, ValidSafetensors({{"a", "F32", {16, 16}}, {"b", "U8", {1000}}}));
  dir.Write(kShard2, ValidSafetensors({{"c", "BF16", {3, 5}}}));
  dir.Write(kIndex, std::string(R"({"weight_map":{"a":")") + kShard1 + R"(","b":")" + kShard1 +
                        R"(","c":")" + kShard2 + R"("}})");
}

WeightManifest LoadedManifest(const std::string& dir) {
  WeightCacheOptions options;
  options.arena.huge_pages = false;
  options.arena.lock = false;
  Result<WeightCache> cache = WeightCache::Load(dir, options);
  EXPECT_TRUE(cache.ok()) << cache.status().ToString();
  return cache.ok() ? cache->Manifest(0xfedcba9876543210) : WeightManifest{};
}

// A manifest with every field set to something other than its default.
WeightManifest FullManifest() {
  WeightManifest m;
  m.generation = 0x8000000000000001;
  m.complete = true;
  m.model_dir = "models/llama";
  m.canonical_model_dir = "/srv/models/llama";
  m.files = {{kIndex, 300, 1700000000123456789, 42, 2049},
             {kShard1, 123456, -5, 43, 2049},
             {kShard2, 99, 1, 18446744073709551615u, 7}};
  m.dir_entries = {kShard1, kShard2, kIndex};
  m.tensors = {{"a", DType::kF32, {16, 16}, 4096 + 120, 1024},
               {"b", DType::kU8, {1000}, 4096 + 1144, 1000},
               {"empty", DType::kBF16, {0, 7}, 8192, 0}};
  m.arena_size = 2 << 20;
  m.arena_inode = 1 << 20;
  m.arena_device = 9;
  m.huge_pages = true;
  m.numa_node = 1;
  m.numa_bound = true;
  m.numa_source = "gpu 0000:17:00.0";
  m.sealed_read_only = true;
  m.load = {.bytes = 124000,
            .seconds = 0.1234567890123,
            .gbps = 1.0 / 3,
            .method = "io_uring+O_DIRECT",
            .fallback_reason = "none"};
  return m;
}

TEST(WeightManifestTest, RoundTripsEveryField) {
  const WeightManifest m = FullManifest();
  const std::string text = EncodeWeightManifest(m);
  Result<WeightManifest> back = DecodeWeightManifest(text, "m");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(*back == m) << text << "\n" << EncodeWeightManifest(*back);
  EXPECT_NE(text.find("\"8000000000000001\""), std::string::npos) << text;
}

TEST(WeightManifestTest, RoundTripsALoadedCache) {
  TempDir dir;
  WriteIndexedModel(dir);
  const WeightManifest m = LoadedManifest(dir.path());
  ASSERT_EQ(m.files.size(), 3u);
  EXPECT_EQ(m.files[0].name, kIndex);  // the index first
  EXPECT_EQ(m.files[1].name, kShard1);
  EXPECT_EQ(m.dir_entries, (std::vector<std::string>{kShard1, kShard2, kIndex}));
  EXPECT_EQ(m.canonical_model_dir, fs::canonical(dir.path()).string());
  EXPECT_EQ(m.model_dir, dir.path());
  EXPECT_TRUE(m.complete);
  struct stat st {};
  ASSERT_EQ(::stat((dir.path() + "/" + kShard2).c_str(), &st), 0);
  EXPECT_EQ(m.files[2].size, static_cast<uint64_t>(st.st_size));
  EXPECT_EQ(m.files[2].inode, st.st_ino);
  EXPECT_EQ(m.tensors.size(), 3u);
  Result<WeightManifest> back = DecodeWeightManifest(EncodeWeightManifest(m), "m");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(*back == m);
}

// Decodes `j` and expects a refusal that mentions `mention`.
void ExpectRefused(const nlohmann::json& j, const std::string& mention) {
  Result<WeightManifest> r = DecodeWeightManifest(j.dump(), "kept.json");
  ASSERT_FALSE(r.ok()) << "accepted, wanted a refusal naming " << mention;
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find(mention), std::string::npos) << r.status().message();
  EXPECT_EQ(r.status().message().rfind("kept.json: ", 0), 0u) << r.status().message();
}

// A partial arena's split and its second memfd round-trip; a manifest without them (made by
// a controller before partial arenas) describes an arena of one memfd.
TEST(WeightManifestTest, RoundTripsThePartsOfAPartialArena) {
  WeightManifest m = FullManifest();
  m.arena_size = 5 << 20;
  m.arena_first_size = 2 << 20;
  m.arena_second_inode = 77;
  m.arena_second_device = 9;
  Result<WeightManifest> back = DecodeWeightManifest(EncodeWeightManifest(m), "m");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(*back == m) << EncodeWeightManifest(*back);

  nlohmann::json old = nlohmann::json::parse(EncodeWeightManifest(FullManifest()));
  ASSERT_FALSE(old["arena"].contains("first_size"));
  Result<WeightManifest> one = DecodeWeightManifest(old.dump(), "m");
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_EQ(one->arena_first_size, 0u);

  for (uint64_t bad : {uint64_t{5} << 20, uint64_t{3} << 19, uint64_t{6} << 20}) {
    nlohmann::json j = nlohmann::json::parse(EncodeWeightManifest(m));
    j["arena"]["first_size"] = bad;
    Result<WeightManifest> refused = DecodeWeightManifest(j.dump(), "m");
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_NE(refused.status().message().find("'arena.first_size'"), std::string::npos)
        << refused.status().ToString();
  }
  nlohmann::json missing = nlohmann::json::parse(EncodeWeightManifest(m));
  missing["arena"].erase("second_inode");
  EXPECT_FALSE(DecodeWeightManifest(missing.dump(), "m").ok());
}

TEST(WeightManifestTest, RefusesAMalformedFieldNamingIt) {
  const nlohmann::json good = nlohmann::json::parse(EncodeWeightManifest(FullManifest()));
  ASSERT_TRUE(DecodeWeightManifest(good.dump(), "kept.json").ok());
  struct Case {
    std::string pointer;   // JSON pointer of the field
    nlohmann::json value;  // null: remove it
    std::string mention;
  };
  const std::vector<Case> cases = {
      {"/format", 2, "'format' is 2"},
      {"/format", "1", "'format'"},
      {"/generation", "12345", "'generation' is not 16 hex digits"},
      {"/generation", "zzzzzzzzzzzzzzzz", "'generation'"},
      {"/generation", 5, "'generation' is not a string"},
      {"/complete", nullptr, "'complete' is missing"},
      {"/model_dir", "", "'model_dir' is empty"},
      {"/canonical_model_dir", "relative/dir", "'canonical_model_dir'"},
      {"/files", nlohmann::json::array(), "'files' is empty"},
      {"/files/1/size", -1, "'files[1].size'"},
      {"/files/1/mtime_ns", 1.5, "'files[1].mtime_ns'"},
      {"/files/1/mtime_ns", 9223372036854775808u, "'files[1].mtime_ns'"},
      {"/files/2/inode", nullptr, "'files[2].inode' is missing"},
      {"/files/0/name", "../etc/passwd", "not a plain file name"},
      {"/files/2/name", kShard1, "'files' names '" + std::string(kShard1) + "' twice"},
      {"/files/1", "x", "'files[1]' is not an object"},
      {"/dir_entries/0", 7, "'dir_entries[0]'"},
      {"/arena/size", 0, "'arena.size' is 0"},
      {"/arena/size", "big", "'arena.size'"},
      {"/arena/inode", nullptr, "'arena.inode' is missing"},
      {"/arena/device", -3, "'arena.device'"},
      {"/arena/huge_pages", 1, "'arena.huge_pages' is not true or false"},
      {"/arena/numa_node", -1, "'arena.numa_node'"},
      {"/arena/colour", "red", "'arena.colour' is not a field"},
      {"/load/seconds", "fast", "'load.seconds'"},
      {"/load/gbps", -1.0, "'load.gbps'"},
      {"/load", nlohmann::json::array(), "'load' is not an object"},
      {"/tensors/1/dtype", "F128", "'tensors[1].dtype'"},
      {"/tensors/0/size", 1025, "'tensors[0].size' is 1025 but the shape and dtype make 1024"},
      {"/tensors/0/shape/0", -16, "'tensors[0].shape'"},
      {"/tensors/0/shape", {4294967296, 4294967296}, "'tensors[0].shape' holds more bytes"},
      {"/tensors/1/offset", (2 << 20) - 999, "'tensors[1].offset' puts the tensor outside"},
      {"/tensors/1/name", "a", "'tensors' names tensor 'a' twice"},
      {"/tensors/2/name", "", "'tensors[2].name' is empty"},
      {"/extra", true, "'extra' is not a field"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.pointer);
    nlohmann::json j = good;
    const nlohmann::json::json_pointer p(c.pointer);
    if (c.value.is_null()) {
      j[p.parent_pointer()].erase(p.back());
    } else {
      j[p] = c.value;
    }
    ExpectRefused(j, c.mention);
  }
}

TEST(WeightManifestTest, RefusesEveryTruncationAndBrokenText) {
  const std::string text = EncodeWeightManifest(FullManifest());
  for (size_t n = 0; n < text.size(); ++n) {
    Result<WeightManifest> r = DecodeWeightManifest(text.substr(0, n), "m");
    ASSERT_FALSE(r.ok()) << "a manifest cut at " << n << " of " << text.size() << " bytes decoded";
    ASSERT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  }
  Result<WeightManifest> cut = DecodeWeightManifest(text.substr(0, text.size() / 2), "m");
  EXPECT_NE(cut.status().message().find("not valid JSON (after field '"), std::string::npos)
      << cut.status().message();

  std::string twice = text;
  twice.insert(1, "\"complete\":false,");
  Result<WeightManifest> dup = DecodeWeightManifest(twice, "m");
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.status().message().find("'complete' appears twice"), std::string::npos)
      << dup.status().message();

  EXPECT_FALSE(DecodeWeightManifest("[]", "m").ok());
  EXPECT_FALSE(DecodeWeightManifest("", "m").ok());
  const std::string deep = std::string(100, '[') + std::string(100, ']');
  Result<WeightManifest> nested = DecodeWeightManifest(deep, "m");
  ASSERT_FALSE(nested.ok());
  EXPECT_NE(nested.status().message().find("nested deeper"), std::string::npos);
  std::string huge = text;
  huge.append(kMaxWeightManifestBytes, ' ');  // valid JSON, too long
  Result<WeightManifest> big = DecodeWeightManifest(huge, "m");
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("more than a manifest may hold"), std::string::npos);
}

// CheckManifestMatches, on a real directory.
class ManifestMatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    WriteIndexedModel(dir_);
    manifest_ = LoadedManifest(dir_.path());
    ASSERT_EQ(manifest_.files.size(), 3u);
  }
  void ExpectMismatch(const std::string& mention) {
    Status s = CheckManifestMatches(manifest_, dir_.path());
    ASSERT_FALSE(s.ok()) << "matched, wanted: " << mention;
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(s.message().find(mention), std::string::npos) << s.message();
  }
  std::string Path(const std::string& name) const { return dir_.path() + "/" + name; }

  TempDir dir_;
  WeightManifest manifest_;
};

TEST_F(ManifestMatchTest, AnUnchangedDirectoryMatchesAlsoThroughASymlink) {
  EXPECT_TRUE(CheckManifestMatches(manifest_, dir_.path()).ok());
  TempDir other;
  const std::string link = other.path() + "/link";
  fs::create_directory_symlink(dir_.path(), link);
  EXPECT_TRUE(CheckManifestMatches(manifest_, link).ok());
  dir_.Write("notes.txt", "files other than the model's do not matter");
  EXPECT_TRUE(CheckManifestMatches(manifest_, dir_.path()).ok());
}

TEST_F(ManifestMatchTest, ANewMtimeIsAChange) {
  const struct timespec times[2] = {{0, UTIME_OMIT}, {1234567, 890}};
  ASSERT_EQ(::utimensat(AT_FDCWD, Path(kShard2).c_str(), times, 0), 0);
  ExpectMismatch(std::string(kShard2) + " changed since the arena was loaded (mtime_ns " +
                 std::to_string(manifest_.files[2].mtime_ns) + " -> 1234567000000890)");
}

TEST_F(ManifestMatchTest, ARewrittenFileIsAChange) {
  dir_.Write(kShard1, ValidSafetensors({{"a", "F32", {16, 17}}, {"b", "U8", {1000}}}));
  ExpectMismatch(std::string(kShard1) + " changed since the arena was loaded (size " +
                 std::to_string(manifest_.files[1].size) + " -> ");
}

TEST_F(ManifestMatchTest, AReplacedFileWithTheSameSizeAndMtimeIsAChange) {
  const std::string tmp = Path("new.tmp");
  fs::copy_file(Path(kShard2), tmp);
  const int64_t ns = manifest_.files[2].mtime_ns;
  const struct timespec times[2] = {{0, UTIME_OMIT}, {ns / 1000000000, ns % 1000000000}};
  ASSERT_EQ(::utimensat(AT_FDCWD, tmp.c_str(), times, 0), 0);
  fs::rename(tmp, Path(kShard2));
  ExpectMismatch(std::string(kShard2) + " changed since the arena was loaded (inode ");
}

TEST_F(ManifestMatchTest, AnAddedOrRemovedModelFileIsAChange) {
  dir_.Write("model-00003-of-00003.safetensors", ValidSafetensors({{"d", "F32", {2}}}));
  ExpectMismatch("model-00003-of-00003.safetensors was added to " + dir_.path() +
                 " since the arena was loaded");
  fs::remove(Path("model-00003-of-00003.safetensors"));
  fs::remove(Path(kShard2));
  ExpectMismatch(std::string(kShard2) + " is gone since the arena was loaded");
}

TEST(WeightManifestTest, AModelFileTheLoadDidNotReadStillCounts) {
  // Present at load but not read (the index names only two shards): its removal still counts,
  // since a listing model would read it.
  TempDir dir;
  WriteIndexedModel(dir);
  dir.Write("spare.safetensors", ValidSafetensors({{"z", "F32", {2}}}));
  const WeightManifest m = LoadedManifest(dir.path());
  EXPECT_EQ(m.files.size(), 3u);
  fs::remove(dir.path() + "/spare.safetensors");
  Status s = CheckManifestMatches(m, dir.path());
  EXPECT_NE(s.message().find("spare.safetensors was removed from"), std::string::npos)
      << s.ToString();
}

TEST_F(ManifestMatchTest, AnotherModelDirectoryIsRefused) {
  TempDir other;
  for (const char* name : {kShard1, kShard2, kIndex}) {
    fs::copy_file(Path(name), other.path() + "/" + name);
  }
  Status s = CheckManifestMatches(manifest_, other.path());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("is not the one the arena was loaded from (" +
                             manifest_.canonical_model_dir + ")"),
            std::string::npos)
      << s.message();
  EXPECT_FALSE(CheckManifestMatches(manifest_, dir_.path() + "/absent").ok());
}

TEST_F(ManifestMatchTest, AnIncompleteManifestIsRefused) {
  manifest_.complete = false;
  ExpectMismatch("not complete");
}

}  // namespace
}  // namespace baton
