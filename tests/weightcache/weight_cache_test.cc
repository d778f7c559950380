#include "weightcache/weight_cache.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>

namespace baton {
namespace {

namespace fs = std::filesystem;

// A tensor to write: name, safetensors dtype, shape; the bytes are generated.
struct TestTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

TestTensor MakeTensor(const std::string& name, const std::string& dtype, std::vector<int64_t> shape,
                      size_t elem_size, uint32_t seed) {
  size_t n = elem_size;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  std::mt19937 rng(seed);
  std::string bytes(n, '\0');
  for (char& c : bytes) c = static_cast<char>(rng());
  return {name, dtype, std::move(shape), std::move(bytes)};
}

// Writes a safetensors file; `pad` goes into __metadata__ to move the data section's start.
void WriteSafetensors(const std::string& path, const std::vector<TestTensor>& tensors,
                      const std::string& pad) {
  nlohmann::ordered_json header;
  if (!pad.empty()) header["__metadata__"] = {{"pad", pad}};
  uint64_t offset = 0;
  for (const TestTensor& t : tensors) {
    header[t.name] = {{"dtype", t.dtype},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  const std::string json = header.dump();
  std::ofstream out(path, std::ios::binary);
  uint64_t n = json.size();
  char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>(n >> (8 * i));
  out.write(len, 8);
  out << json;
  for (const TestTensor& t : tensors) out << t.bytes;
}

class TempDir {
 public:
  TempDir() {
    std::string tmpl = ::testing::TempDir() + "baton-cache-XXXXXX";
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() { fs::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Three shards whose data sections start at different page offsets, with an index.
std::vector<TestTensor> WriteShardedModel(const std::string& dir) {
  std::vector<std::vector<TestTensor>> shards = {
      {MakeTensor("embed.weight", "BF16", {33, 17}, 2, 1),
       MakeTensor("layers.0.attn.q.weight", "F32", {64, 65}, 4, 2)},
      {MakeTensor("layers.0.mlp.up.weight", "F16", {129, 31}, 2, 3),
       MakeTensor("layers.0.norm.weight", "F32", {7}, 4, 4),
       MakeTensor("layers.0.scale", "U8", {4099}, 1, 5)},
      {MakeTensor("lm_head.weight", "BF16", {1000, 3}, 2, 6),
       MakeTensor("empty", "F32", {0, 5}, 4, 7)},
  };
  const std::vector<std::string> pads = {"", std::string(4000, 'x'), std::string(1234, 'y')};
  nlohmann::json index;
  index["metadata"] = {{"total_size", 0}};
  std::vector<TestTensor> all;
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string file = "model-0000" + std::to_string(i + 1) + "-of-00003.safetensors";
    WriteSafetensors(dir + "/" + file, shards[i], pads[i]);
    for (const TestTensor& t : shards[i]) {
      index["weight_map"][t.name] = file;
      all.push_back(t);
    }
  }
  std::ofstream(dir + "/model.safetensors.index.json") << index.dump();
  return all;
}

void ExpectHolds(const WeightCache& cache, const std::vector<TestTensor>& tensors) {
  ASSERT_EQ(cache.tensors().size(), tensors.size());
  uint64_t bytes = 0;
  for (const TestTensor& t : tensors) {
    const CachedTensor* c = cache.Find(t.name);
    ASSERT_NE(c, nullptr) << t.name;
    EXPECT_EQ(c->shape, t.shape) << t.name;
    EXPECT_EQ(DTypeName(c->dtype), t.dtype) << t.name;
    ASSERT_EQ(c->size, t.bytes.size()) << t.name;
    ASSERT_LE(c->offset + c->size, cache.arena().size()) << t.name;
    EXPECT_EQ(std::memcmp(cache.TensorData(*c), t.bytes.data(), c->size), 0) << t.name;
    bytes += c->size;
  }
  EXPECT_EQ(cache.tensor_bytes(), bytes);
  EXPECT_EQ(cache.Find("no.such.tensor"), nullptr);
  for (size_t i = 1; i < cache.tensors().size(); ++i) {
    EXPECT_LT(cache.tensors()[i - 1].name, cache.tensors()[i].name);
  }
}

class WeightCacheModeTest : public ::testing::TestWithParam<std::tuple<bool, bool, bool>> {};

TEST_P(WeightCacheModeTest, LoadsAShardedModelByteForByte) {
  TempDir dir;
  const std::vector<TestTensor> tensors = WriteShardedModel(dir.path());
  WeightCacheOptions options;
  options.load.use_uring = std::get<0>(GetParam());
  options.load.direct = std::get<1>(GetParam());
  options.arena.huge_pages = std::get<2>(GetParam());
  options.load.chunk_size = 8192;
  options.load.queue_depth = 4;
  auto cache = WeightCache::Load(dir.path(), options);
  ASSERT_TRUE(cache.ok()) << cache.status().ToString();
  ExpectHolds(*cache, tensors);
  EXPECT_EQ(cache->dir(), dir.path());
  if (!std::get<2>(GetParam())) {
    EXPECT_FALSE(cache->arena().huge_pages());
  } else if (!cache->arena().huge_pages()) {
    EXPECT_FALSE(cache->arena().warnings().empty());  // none reserved on this machine
  }
  EXPECT_EQ(cache->load_stats().method.rfind(options.load.use_uring ? "io_uring" : "pread", 0), 0u);
  // Every shard's whole file (but the page below its data) was read.
  uint64_t file_bytes = 0;
  for (const auto& entry : fs::directory_iterator(dir.path())) {
    if (entry.path().extension() == ".safetensors") file_bytes += entry.file_size();
  }
  EXPECT_LE(cache->load_stats().bytes, file_bytes);
  EXPECT_GT(cache->load_stats().bytes, cache->tensor_bytes());
}

INSTANTIATE_TEST_SUITE_P(Modes, WeightCacheModeTest,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool(),
                                            ::testing::Bool()));

TEST(WeightCacheTest, SharesTheArenaReadOnlyWithAnotherProcess) {
  TempDir dir;
  const std::vector<TestTensor> tensors = WriteShardedModel(dir.path());
  auto cache = WeightCache::Load(dir.path(), {});
  ASSERT_TRUE(cache.ok()) << cache.status().ToString();
  EXPECT_TRUE(cache->arena().sealed_read_only());
  for (const std::string& w : cache->arena().warnings()) {
    EXPECT_EQ(w.find("seal"), std::string::npos) << w;
  }
  auto fd = cache->arena().memory().Dup();
  ASSERT_TRUE(fd.ok());
  const int raw = fd->get();
  const CachedTensor* t = cache->Find("layers.0.scale");
  ASSERT_NE(t, nullptr);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The child sees only the fd number and the table entry, as an engine would.
    auto shm = SharedMemory::Import(UniqueFd(::dup(raw)));
    if (!shm.ok()) ::_exit(10);
    auto view = shm->Map(Protection::kReadOnly);
    if (!view.ok()) ::_exit(11);
    if (shm->Map(Protection::kReadWrite).ok()) ::_exit(13);  // sealed read-only
    const std::string& want = tensors[4].bytes;
    ::_exit(std::memcmp(view->data() + t->offset, want.data(), want.size()) == 0 ? 0 : 12);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(WeightCacheTest, LaysDataOutSoDirectReadsNeedNoCopy) {
  TempDir dir;
  WriteShardedModel(dir.path());
  auto files = ModelFiles::Open(dir.path());
  ASSERT_TRUE(files.ok()) << files.status().ToString();
  auto cache = WeightCache::Load(dir.path(), {});
  ASSERT_TRUE(cache.ok());
  for (const SafetensorsIndex& shard : files->shards()) {
    for (const TensorInfo& info : shard.tensors()) {
      const CachedTensor* t = cache->Find(info.name);
      ASSERT_NE(t, nullptr);
      // Same position within its page as in the file.
      EXPECT_EQ(t->offset % 4096, (shard.data_offset() + info.begin) % 4096) << info.name;
    }
  }
}

TEST(WeightCacheTest, LoadsASingleFileModel) {
  TempDir dir;
  std::vector<TestTensor> tensors = {MakeTensor("w", "F32", {3, 1000}, 4, 11),
                                     MakeTensor("b", "I8", {5}, 1, 12)};
  WriteSafetensors(dir.path() + "/model.safetensors", tensors, "z");
  auto cache = WeightCache::Load(dir.path(), {});
  ASSERT_TRUE(cache.ok()) << cache.status().ToString();
  ExpectHolds(*cache, tensors);
}

// Truncated while its chunks are read (the loader sees it end early) or between validation and
// the loader's open (the load comes up short of the validated size): refused either way.
TEST(WeightCacheTest, RefusesAShardTruncatedWhileItLoads) {
  TempDir dir;
  const std::string path = dir.path() + "/model.safetensors";
  WriteSafetensors(path, {MakeTensor("w", "F32", {3, 100000}, 4, 11)}, "z");
  WeightCacheOptions options;
  options.load.chunk_size = 4096;
  options.load.queue_depth = 1;
  options.load.progress = [&, done = false](uint64_t, uint64_t) mutable {
    if (done) return;
    done = true;
    ASSERT_EQ(::truncate(path.c_str(), 8192), 0);
  };
  auto cache = WeightCache::Load(dir.path(), options);
  ASSERT_FALSE(cache.ok()) << "a short shard loaded with zeros for its tail";
  EXPECT_EQ(cache.status().code(), StatusCode::kDataLoss) << cache.status().ToString();
}

TEST(WeightCacheTest, RefusesMissingAndMalformedModels) {
  TempDir dir;
  auto none = WeightCache::Load(dir.path() + "/absent", {});
  EXPECT_FALSE(none.ok());
  std::ofstream(dir.path() + "/model.safetensors", std::ios::binary) << std::string(8, '\xff');
  auto bad = WeightCache::Load(dir.path(), {});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("model.safetensors"), std::string::npos)
      << bad.status().message();
}

struct ToolRun {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Runs build/bin/baton-weights with `args`; stdout and stderr are captured.
ToolRun RunTool(const std::string& args) {
  const std::string err_path =
      ::testing::TempDir() + "baton-weights-stderr-" + std::to_string(::getpid());
  const std::string cmd = std::string(BATON_BIN_DIR) + "/baton-weights " + args + " 2>" + err_path;
  ToolRun run;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return run;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) run.out.append(buf, n);
  const int status = ::pclose(p);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream in(err_path);
  run.err.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  fs::remove(err_path);
  return run;
}

nlohmann::json LastLineJson(const std::string& out) {
  std::string text = out;
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return nlohmann::json::parse(text.substr(text.rfind('\n') + 1));
}

class WeightsToolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(std::string(BATON_BIN_DIR) + "/baton-weights")) {
      GTEST_SKIP() << "baton-weights is not built";
    }
    tensors_ = WriteShardedModel(dir_.path());
  }
  TempDir dir_;
  std::vector<TestTensor> tensors_;
};

TEST_F(WeightsToolTest, LoadPrintsWhatTheCacheHolds) {
  ToolRun run = RunTool("load " + dir_.path() + " --json --queue-depth 8 --chunk-mib 1");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  nlohmann::json j = LastLineJson(run.out);
  EXPECT_EQ(j["tensors"], tensors_.size());
  EXPECT_GT(j["arena_bytes"].get<uint64_t>(), j["tensor_bytes"].get<uint64_t>());
  EXPECT_TRUE(j["load_s"].is_number());
  EXPECT_TRUE(j["load_gbps"].is_number());
  EXPECT_TRUE(j["huge_pages"].is_boolean());
  EXPECT_EQ(j["numa_node"], 0);
  EXPECT_TRUE(j["warnings"].is_array());

  ToolRun plain = RunTool("load " + dir_.path() + " --no-uring --no-direct --numa 0");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_NE(plain.out.find("pread"), std::string::npos) << plain.out;
}

TEST_F(WeightsToolTest, InspectShowsTheHeaderAndRefusesMalformedFiles) {
  ToolRun run = RunTool("inspect " + dir_.path() + " --json");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  nlohmann::json j = LastLineJson(run.out);
  EXPECT_EQ(j["files"].size(), 3u);
  EXPECT_EQ(j["tensors"], tensors_.size());
  EXPECT_EQ(j["files"][0]["tensors"][0]["name"], "embed.weight");
  EXPECT_EQ(j["files"][0]["tensors"][0]["dtype"], "BF16");

  const std::string bad = dir_.path() + "/bad.bin";
  std::ofstream(bad, std::ios::binary) << std::string("\x05\0\0\0\0\0\0\0{\"a\"", 12);
  ToolRun refused = RunTool("inspect " + bad);
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_NE(refused.err.find("bad.bin"), std::string::npos) << refused.err;
}

TEST_F(WeightsToolTest, BadUsageExitsTwo) {
  EXPECT_EQ(RunTool("").exit_code, 2);
  EXPECT_EQ(RunTool("frobnicate x").exit_code, 2);
  EXPECT_EQ(RunTool("load").exit_code, 2);
  EXPECT_EQ(RunTool("load " + dir_.path() + " --queue-depth").exit_code, 2);
  EXPECT_EQ(RunTool("load " + dir_.path() + " --chunk-mib 0").exit_code, 2);
  EXPECT_EQ(RunTool("inspect " + dir_.path() + " --no-direct").exit_code, 2);
  EXPECT_EQ(RunTool("load " + dir_.path() + "/absent").exit_code, 1);
}

TEST_F(WeightsToolTest, HashThenVerifyCatchesAFlippedByte) {
  EXPECT_EQ(RunTool("verify " + dir_.path()).exit_code, 1);  // no manifest yet
  ToolRun hash = RunTool("hash " + dir_.path());
  ASSERT_EQ(hash.exit_code, 0) << hash.err;
  EXPECT_TRUE(fs::exists(dir_.path() + "/baton-integrity.json"));
  ToolRun ok = RunTool("verify " + dir_.path() + " --json");
  ASSERT_EQ(ok.exit_code, 0) << ok.err << ok.out;
  EXPECT_EQ(LastLineJson(ok.out)["checked"], tensors_.size());

  const std::string shard = dir_.path() + "/model-00002-of-00003.safetensors";
  std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(-10, std::ios::end);  // inside layers.0.scale, the shard's last tensor
  f.put('\x7f');
  f.close();
  ToolRun bad = RunTool("verify " + dir_.path());
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.out.find("layers.0.scale"), std::string::npos) << bad.out;
}

}  // namespace
}  // namespace baton
