#include "standby/mkmodel/model_writer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>

#include "standby/kernels/half.h"
#include "weightcache/model_files.h"
#include "weightcache/safetensors/safetensors_index.h"

namespace baton {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "baton-mkmodel-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string Sub(const std::string& name) const { return (fs::path(path_) / name).string(); }

 private:
  std::string path_;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::set<std::string> ListDir(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  return names;
}

ModelSpec Tiny(uint64_t seed = 0, int shards = 1, DType dtype = DType::kF32) {
  ModelSpec spec = PresetSpec("tiny", dtype);
  spec.seed = seed;
  spec.shards = shards;
  return spec;
}

// The parsed JSON header of a safetensors file, after checking its framing.
nlohmann::json ReadHeader(const std::string& path, uint64_t* data_offset) {
  const std::string bytes = ReadFile(path);
  uint64_t n = 0;
  EXPECT_GE(bytes.size(), 8u);
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u) << path;
  *data_offset = 8 + n;
  return nlohmann::json::parse(bytes.substr(8, n));
}

TEST(ModelWriterTest, SameSeedIsByteIdenticalDifferentSeedDiffers) {
  TempDir tmp;
  ASSERT_TRUE(WriteModel(Tiny(1), tmp.Sub("a")).ok());
  ASSERT_TRUE(WriteModel(Tiny(1), tmp.Sub("b")).ok());
  WriteOptions one_thread;
  one_thread.threads = 1;
  ASSERT_TRUE(WriteModel(Tiny(1), tmp.Sub("c"), one_thread).ok());
  ASSERT_TRUE(WriteModel(Tiny(2), tmp.Sub("d")).ok());
  EXPECT_EQ(ListDir(tmp.Sub("a")), (std::set<std::string>{"config.json", "model.safetensors"}));
  for (const char* file : {"config.json", "model.safetensors"}) {
    const std::string a = ReadFile(tmp.Sub("a") + "/" + file);
    EXPECT_EQ(a, ReadFile(tmp.Sub("b") + "/" + file)) << file;
    EXPECT_EQ(a, ReadFile(tmp.Sub("c") + "/" + file)) << file;
  }
  const std::string a = ReadFile(tmp.Sub("a") + "/model.safetensors");
  const std::string d = ReadFile(tmp.Sub("d") + "/model.safetensors");
  ASSERT_EQ(a.size(), d.size());
  EXPECT_NE(a, d);
  uint64_t offset = 0;
  EXPECT_EQ(ReadHeader(tmp.Sub("a") + "/model.safetensors", &offset),
            ReadHeader(tmp.Sub("d") + "/model.safetensors", &offset));
}

TEST(ModelWriterTest, SameBytesOnAnotherFileSystem) {
  if (!fs::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm";
  TempDir tmp;
  const std::string shm = "/dev/shm/baton-mkmodel-test-" + std::to_string(::getpid());
  ASSERT_TRUE(WriteModel(Tiny(3, 2, DType::kF16), tmp.Sub("m")).ok());
  ASSERT_TRUE(WriteModel(Tiny(3, 2, DType::kF16), shm).ok());
  for (const char* file : {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                           "model.safetensors.index.json", "config.json"}) {
    EXPECT_EQ(ReadFile(tmp.Sub("m") + "/" + file), ReadFile(shm + "/" + file)) << file;
  }
  fs::remove_all(shm);
}

TEST(ModelWriterTest, HeaderIsValidSafetensors) {
  TempDir tmp;
  Result<ModelSummary> summary = WriteModel(Tiny(), tmp.Sub("m"));
  ASSERT_TRUE(summary.ok()) << summary.status().ToString();
  const std::string path = tmp.Sub("m") + "/model.safetensors";
  uint64_t data_offset = 0;
  const nlohmann::json header = ReadHeader(path, &data_offset);
  EXPECT_EQ(header["__metadata__"], (nlohmann::json{{"format", "pt"}}));
  const ModelSpec spec = Tiny();
  EXPECT_EQ(header.size() - 1, 3u + 9u * spec.num_hidden_layers);
  const int64_t kv = spec.num_key_value_heads * spec.head_dim();
  EXPECT_EQ(header["model.embed_tokens.weight"]["shape"],
            nlohmann::json::array({spec.vocab_size, spec.hidden_size}));
  EXPECT_EQ(header["model.layers.1.self_attn.k_proj.weight"]["shape"],
            nlohmann::json::array({kv, spec.hidden_size}));
  EXPECT_EQ(header["model.layers.0.mlp.down_proj.weight"]["shape"],
            nlohmann::json::array({spec.hidden_size, spec.intermediate_size}));
  EXPECT_EQ(header["lm_head.weight"]["dtype"], "F32");
  // Ranges are contiguous from 0 and end at the end of the file.
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, t] : header.items()) {
    if (name != "__metadata__") ranges.emplace_back(t["data_offsets"][0], t["data_offsets"][1]);
  }
  std::sort(ranges.begin(), ranges.end());
  uint64_t next = 0;
  for (const auto& [b, e] : ranges) {
    EXPECT_EQ(b, next);
    next = e;
  }
  EXPECT_EQ(data_offset + next, fs::file_size(path));
  EXPECT_EQ(summary->tensor_bytes, next);
  EXPECT_EQ(summary->file_bytes, fs::file_size(path));
  EXPECT_EQ(summary->tensor_count, ranges.size());
}

TEST(ModelWriterTest, ShardIndexIsConsistent) {
  TempDir tmp;
  const std::string dir = tmp.Sub("m");
  Result<ModelSummary> summary = WriteModel(Tiny(3, 3), dir);
  ASSERT_TRUE(summary.ok()) << summary.status().ToString();
  EXPECT_EQ(ListDir(dir),
            (std::set<std::string>{
                "config.json", "model.safetensors.index.json", "model-00001-of-00003.safetensors",
                "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors"}));
  const nlohmann::json index =
      nlohmann::json::parse(ReadFile(dir + "/model.safetensors.index.json"));
  std::map<std::string, std::string> seen;  // tensor -> file, from the headers
  uint64_t total = 0;
  for (int k = 1; k <= 3; ++k) {
    const std::string file = "model-0000" + std::to_string(k) + "-of-00003.safetensors";
    uint64_t offset = 0;
    const nlohmann::json header = ReadHeader(dir + "/" + file, &offset);
    EXPECT_GT(header.size(), 1u) << file;
    for (const auto& [name, t] : header.items()) {
      if (name == "__metadata__") continue;
      EXPECT_TRUE(seen.emplace(name, file).second) << name << " in two shards";
      total += t["data_offsets"][1].get<uint64_t>() - t["data_offsets"][0].get<uint64_t>();
    }
  }
  EXPECT_EQ(index["metadata"]["total_size"], total);
  EXPECT_EQ(total, summary->tensor_bytes);
  ASSERT_EQ(index["weight_map"].size(), seen.size());
  for (const auto& [name, file] : seen) EXPECT_EQ(index["weight_map"][name], file) << name;
}

TEST(ModelWriterTest, ValuesFollowTheGeneratorAndItsDistribution) {
  TempDir tmp;
  const std::string dir = tmp.Sub("m");
  ASSERT_TRUE(WriteModel(Tiny(5), dir).ok());
  Result<ModelLayout> layout = PlanModel(Tiny(5));
  ASSERT_TRUE(layout.ok());
  const std::string bytes = ReadFile(dir + "/model.safetensors");
  const uint64_t data = layout->shards[0].header.size();
  for (const PlannedTensor& t : layout->tensors) {
    std::vector<float> expected(t.element_count), actual(t.element_count);
    GenerateTensorValues(t, 0, expected.size(), expected.data());
    std::memcpy(actual.data(), bytes.data() + data + t.begin, t.end - t.begin);
    ASSERT_EQ(actual, expected) << t.name;
    double sum = 0, sq = 0;
    for (float v : actual) sum += v, sq += v * v;
    const double mean = sum / actual.size();
    const double stddev = std::sqrt(sq / actual.size() - mean * mean);
    EXPECT_NEAR(mean, t.mean, 0.02 + 4 * t.stddev / std::sqrt(actual.size())) << t.name;
    EXPECT_NEAR(stddev, t.stddev, 0.1 * t.stddev) << t.name;
  }
  const PlannedTensor& q = layout->tensors[2];
  EXPECT_EQ(q.name, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_FLOAT_EQ(q.stddev, 1.0f / 8.0f);          // 1/sqrt(hidden 64)
  EXPECT_FLOAT_EQ(layout->tensors[1].mean, 1.0f);  // input_layernorm
}

TEST(ModelWriterTest, HalfPrecisionFilesHoldRoundedValues) {
  TempDir tmp;
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    const std::string dir = tmp.Sub(std::string(TorchDTypeName(dtype)));
    ASSERT_TRUE(WriteModel(Tiny(9, 1, dtype), dir).ok());
    Result<ModelLayout> layout = PlanModel(Tiny(9, 1, dtype));
    ASSERT_TRUE(layout.ok());
    const std::string bytes = ReadFile(dir + "/model.safetensors");
    const uint64_t data = layout->shards[0].header.size();
    EXPECT_EQ(bytes.size(), data + PlanModel(Tiny(9)).value().tensor_bytes / 2);
    for (const PlannedTensor& t : layout->tensors) {
      std::vector<float> values(t.element_count);
      GenerateTensorValues(t, 0, values.size(), values.data());
      for (size_t i = 0; i < values.size(); i += 7) {
        uint16_t stored;
        std::memcpy(&stored, bytes.data() + data + t.begin + 2 * i, 2);
        const uint16_t want =
            dtype == DType::kF16 ? FloatToHalf(values[i]) : FloatToBFloat16(values[i]);
        ASSERT_EQ(stored, want) << t.name << "[" << i << "]";
      }
    }
    uint64_t offset = 0;
    EXPECT_EQ(ReadHeader(dir + "/model.safetensors", &offset)["lm_head.weight"]["dtype"],
              dtype == DType::kF16 ? "F16" : "BF16");
  }
}

TEST(ModelWriterTest, FillShardDataIsRandomAccess) {
  Result<ModelLayout> layout = PlanModel(Tiny(4, 2, DType::kBF16));
  ASSERT_TRUE(layout.ok());
  const uint64_t size = layout->shards[1].data_size;
  std::vector<uint8_t> whole(size), pieces(size);
  FillShardData(*layout, 1, 0, size, whole.data());
  for (uint64_t a = 0; a < size;) {
    const uint64_t b = std::min(size, a + 2 * (1 + a % 4099));
    FillShardData(*layout, 1, a, b, pieces.data() + a);
    a = b;
  }
  EXPECT_EQ(whole, pieces);
}

TEST(ModelWriterTest, OneShardPerTensorWorks) {
  TempDir tmp;
  const int tensors = 3 + 9 * 2;
  Result<ModelSummary> summary = WriteModel(Tiny(0, tensors), tmp.Sub("m"));
  ASSERT_TRUE(summary.ok()) << summary.status().ToString();
  EXPECT_EQ(summary->files.size(), static_cast<size_t>(tensors) + 2);
}

TEST(ModelWriterTest, RewriteReplacesAnEarlierModel) {
  TempDir tmp;
  const std::string dir = tmp.Sub("m");
  ASSERT_TRUE(WriteModel(Tiny(0, 4), dir).ok());
  std::ofstream(dir + "/notes.txt") << "kept";
  ASSERT_TRUE(WriteModel(Tiny(0, 1), dir).ok());
  EXPECT_EQ(ListDir(dir), (std::set<std::string>{"config.json", "model.safetensors", "notes.txt"}));
}

// A model baton-mkmodel did not write (a downloaded one) is never removed to make room.
TEST(ModelWriterTest, ADirectoryHoldingAnotherModelIsRefusedAndLeftAsItIs) {
  TempDir tmp;
  const std::string dir = tmp.Sub("m");
  fs::create_directories(dir);
  std::ofstream(dir + "/config.json") << R"({"model_type": "llama"})";
  std::ofstream(dir + "/model.safetensors") << "weights";
  for (bool reuse : {false, true}) {
    WriteOptions options;
    options.reuse = reuse;
    Result<ModelSummary> refused = WriteModel(Tiny(0, 1), dir, options);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(refused.status().message().find("holds a model baton-mkmodel did not write"),
              std::string::npos)
        << refused.status().ToString();
  }
  EXPECT_EQ(ListDir(dir), (std::set<std::string>{"config.json", "model.safetensors"}));
}

TEST(ModelWriterTest, ReuseKeepsAMatchingModelAndRewritesADamagedOne) {
  TempDir tmp;
  const std::string dir = tmp.Sub("m");
  WriteOptions reuse;
  reuse.reuse = true;
  Result<ModelSummary> first = WriteModel(Tiny(0, 2), dir, reuse);
  ASSERT_TRUE(first.ok());
  EXPECT_FALSE(first->reused);
  Result<ModelSummary> second = WriteModel(Tiny(0, 2), dir, reuse);
  ASSERT_TRUE(second.ok());
  EXPECT_TRUE(second->reused);
  Result<ModelLayout> layout = PlanModel(Tiny(0, 2));
  ASSERT_TRUE(CheckWrittenModel(*layout, dir).ok());

  const std::string shard = dir + "/model-00002-of-00002.safetensors";
  const uint64_t size = fs::file_size(shard);
  fs::resize_file(shard, size - 1);
  const Status damaged = CheckWrittenModel(*layout, dir);
  EXPECT_EQ(damaged.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(damaged.message().find("model-00002-of-00002.safetensors"), std::string::npos);
  Result<ModelSummary> third = WriteModel(Tiny(0, 2), dir, reuse);
  ASSERT_TRUE(third.ok());
  EXPECT_FALSE(third->reused);
  EXPECT_EQ(fs::file_size(shard), size);
  // A different seed is a different model.
  EXPECT_FALSE(CheckWrittenModel(PlanModel(Tiny(1, 2)).value(), dir).ok());
}

TEST(ModelWriterTest, RefusesBadSpecsAndUnwritableDirectories) {
  TempDir tmp;
  ModelSpec bad = Tiny();
  bad.num_attention_heads = 5;
  Result<ModelSummary> refused = WriteModel(bad, tmp.Sub("m"));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(fs::exists(tmp.Sub("m")));

  std::ofstream(tmp.Sub("file")) << "x";
  Result<ModelSummary> not_dir = WriteModel(Tiny(), tmp.Sub("file"));
  ASSERT_FALSE(not_dir.ok());
  EXPECT_NE(not_dir.status().message().find("file"), std::string::npos);
  EXPECT_FALSE(WriteModel(Tiny(), "").ok());
}

TEST(ModelWriterTest, ParsesWithSafetensorsIndexAndModelFiles) {
  TempDir tmp;
  for (int shards : {1, 3}) {
    const std::string dir = tmp.Sub("m" + std::to_string(shards));
    const ModelSpec spec = Tiny(11, shards, DType::kBF16);
    Result<ModelSummary> summary = WriteModel(spec, dir);
    ASSERT_TRUE(summary.ok());
    Result<ModelLayout> layout = PlanModel(spec);
    for (const PlannedShard& shard : layout->shards) {
      Result<SafetensorsIndex> index = SafetensorsIndex::ParseFile(dir + "/" + shard.file_name);
      ASSERT_TRUE(index.ok()) << index.status().ToString();
      EXPECT_EQ(index->tensors().size(), shard.tensors.size());
      EXPECT_EQ(index->data_offset() % 8, 0u);
      EXPECT_EQ(index->file_size(), shard.file_size());
      EXPECT_EQ(index->metadata().at("format"), "pt");
    }
    Result<ModelFiles> files = ModelFiles::Open(dir);
    ASSERT_TRUE(files.ok()) << files.status().ToString();
    EXPECT_EQ(files->shards().size(), static_cast<size_t>(shards));
    EXPECT_EQ(files->tensor_count(), summary->tensor_count);
    EXPECT_EQ(files->total_tensor_bytes(), summary->tensor_bytes);
    EXPECT_EQ(files->total_file_bytes(), summary->file_bytes);
    for (const PlannedTensor& t : layout->tensors) {
      const ModelFiles::Location* loc = files->Find(t.name);
      ASSERT_NE(loc, nullptr) << t.name;
      EXPECT_EQ(loc->shard, t.shard);
      EXPECT_EQ(loc->tensor->shape, t.shape);
      EXPECT_EQ(loc->tensor->dtype, DType::kBF16);
      EXPECT_EQ(loc->tensor->begin, t.begin);
    }
  }
}

}  // namespace
}  // namespace baton
