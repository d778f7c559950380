// Test helpers for the weight cache's tests: MakeTensor() generates a tensor's bytes,
// WriteSafetensors() writes them as a safetensors file, WriteShardedModel() writes a model of
// three shards (data sections starting at different page offsets) with an index, and TempDir
// is a directory removed with its contents on destruction. Header-only; single-threaded use.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

namespace baton::cachetest {

// A tensor to write: name, safetensors dtype, shape; the bytes are generated.
struct TestTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

inline TestTensor MakeTensor(const std::string& name, const std::string& dtype,
                             std::vector<int64_t> shape, size_t elem_size, uint32_t seed) {
  size_t n = elem_size;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  std::mt19937 rng(seed);
  std::string bytes(n, '\0');
  for (char& c : bytes) c = static_cast<char>(rng());
  return {name, dtype, std::move(shape), std::move(bytes)};
}

// Writes a safetensors file; `pad` goes into __metadata__ to move the data section's start.
inline void WriteSafetensors(const std::string& path, const std::vector<TestTensor>& tensors,
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
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Three shards whose data sections start at different page offsets, with an index.
inline std::vector<TestTensor> WriteShardedModel(const std::string& dir) {
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

}  // namespace baton::cachetest
