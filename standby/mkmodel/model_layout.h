// ModelLayout: everything about a synthetic model's files that follows from its ModelSpec,
// computed before a byte is written: the tensors (HF Llama names and [out, in] shapes, and
// the distribution each one's values are drawn from), which shard holds each tensor and at
// which byte range, each shard's complete safetensors header, and the shard index JSON.
//
// Values are a pure function of (seed, tensor name, element index): a counter-based
// splitmix64 stream per tensor, shaped into a roughly normal distribution (sum of four
// uniforms), with std 1/sqrt(fan_in) for projections and mean 1 for norm weights. Any range
// of any tensor can therefore be generated on its own, in any order, on any thread.
// Plain values; thread-compatible (const methods and free functions are thread-safe).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "standby/mkmodel/model_presets.h"

namespace baton {

struct PlannedTensor {
  std::string name;
  std::vector<int64_t> shape;
  uint64_t element_count = 0;
  float mean = 0;  // values are mean + stddev x (approximately) N(0, 1)
  float stddev = 0;
  uint64_t key = 0;  // per-tensor stream key, from (seed, name)
  size_t shard = 0;
  uint64_t begin = 0;  // byte range in the shard's data section
  uint64_t end = 0;
};

struct PlannedShard {
  std::string file_name;        // "model.safetensors" or "model-0000K-of-0000N.safetensors"
  std::string header;           // 8-byte length, JSON, space padding (data starts 8-aligned)
  std::vector<size_t> tensors;  // indices into ModelLayout::tensors, in data order
  uint64_t data_size = 0;
  uint64_t file_size() const { return header.size() + data_size; }
};

struct ModelLayout {
  ModelSpec spec;
  std::vector<PlannedTensor> tensors;  // model order: embed, layers, norm, lm_head
  std::vector<PlannedShard> shards;
  std::string index_json;  // model.safetensors.index.json; empty with one shard
  uint64_t tensor_bytes = 0;
  uint64_t file_bytes = 0;
};

inline constexpr char kConfigFileName[] = "config.json";
inline constexpr char kSingleFileName[] = "model.safetensors";
inline constexpr char kIndexFileName[] = "model.safetensors.index.json";

// Validates `spec` and lays out its files.
Result<ModelLayout> PlanModel(const ModelSpec& spec);

// The shard file name for shard `index` (0-based) of `count`.
std::string ShardFileName(size_t index, size_t count);

// Writes values [first, first + count) of `tensor` as floats.
void GenerateTensorValues(const PlannedTensor& tensor, uint64_t first, size_t count, float* out);

// Writes bytes [begin, end) of shard `shard`'s data section, in the spec's dtype
// (little-endian). `begin` and `end` must be multiples of the element size.
void FillShardData(const ModelLayout& layout, size_t shard, uint64_t begin, uint64_t end,
                   uint8_t* out);

}  // namespace baton
