#include "standby/mkmodel/model_layout.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "standby/kernels/half.h"

namespace baton {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; this writer stores native floats");

constexpr uint64_t kGoldenGamma = 0x9e3779b97f4a7c15ull;
constexpr float kNormStddev = 0.05f;

uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t Fnv1a64(std::string_view text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : text) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// The sum of four 16-bit uniforms, centred and scaled to unit variance: an Irwin-Hall
// approximation of N(0, 1), bounded by +-2 sqrt(3).
float UnitNormal(uint64_t r) {
  const int32_t sum =
      static_cast<int32_t>((r & 0xffff) + ((r >> 16) & 0xffff) + ((r >> 32) & 0xffff) + (r >> 48));
  constexpr float kScale = 1.7320508075688772f / 65536.0f;
  return static_cast<float>(sum - 2 * 65535) * kScale;
}

std::string_view SafetensorsDTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    default:
      return "F32";
  }
}

void AddTensor(ModelLayout& layout, std::string name, std::vector<int64_t> shape, float mean,
               float stddev) {
  PlannedTensor t;
  t.element_count = 1;
  for (int64_t d : shape) t.element_count *= static_cast<uint64_t>(d);
  t.name = std::move(name);
  t.shape = std::move(shape);
  t.mean = mean;
  t.stddev = stddev;
  t.key = Mix64(layout.spec.seed ^ Mix64(Fnv1a64(t.name)));
  layout.tensors.push_back(std::move(t));
}

void AddTensors(ModelLayout& layout) {
  const ModelSpec& s = layout.spec;
  const int64_t h = s.hidden_size;
  const int64_t kv = static_cast<int64_t>(s.num_key_value_heads) * s.head_dim();
  const int64_t inter = s.intermediate_size;
  const float in_h = 1.0f / std::sqrt(static_cast<float>(h));
  const float in_inter = 1.0f / std::sqrt(static_cast<float>(inter));
  // An embedding row is selected by a one-hot input (fan_in 1).
  AddTensor(layout, "model.embed_tokens.weight", {s.vocab_size, h}, 0.0f, 1.0f);
  for (int i = 0; i < s.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    AddTensor(layout, p + "input_layernorm.weight", {h}, 1.0f, kNormStddev);
    AddTensor(layout, p + "self_attn.q_proj.weight", {h, h}, 0.0f, in_h);
    AddTensor(layout, p + "self_attn.k_proj.weight", {kv, h}, 0.0f, in_h);
    AddTensor(layout, p + "self_attn.v_proj.weight", {kv, h}, 0.0f, in_h);
    AddTensor(layout, p + "self_attn.o_proj.weight", {h, h}, 0.0f, in_h);
    AddTensor(layout, p + "post_attention_layernorm.weight", {h}, 1.0f, kNormStddev);
    AddTensor(layout, p + "mlp.gate_proj.weight", {inter, h}, 0.0f, in_h);
    AddTensor(layout, p + "mlp.up_proj.weight", {inter, h}, 0.0f, in_h);
    AddTensor(layout, p + "mlp.down_proj.weight", {h, inter}, 0.0f, in_inter);
  }
  AddTensor(layout, "model.norm.weight", {h}, 1.0f, kNormStddev);
  AddTensor(layout, "lm_head.weight", {s.vocab_size, h}, 0.0f, in_h);
}

// Cuts the tensors, in order, into `count` contiguous non-empty runs of about equal bytes;
// returns the index of each run's first tensor.
std::vector<size_t> ShardStarts(const std::vector<uint64_t>& sizes, size_t count) {
  uint64_t total = 0;
  for (uint64_t s : sizes) total += s;
  std::vector<size_t> starts = {0};
  uint64_t before = 0;  // bytes of tensors [0, i)
  size_t i = 0;
  for (size_t k = 1; k < count; ++k) {
    const uint64_t target = static_cast<uint64_t>(static_cast<long double>(total) *
                                                  static_cast<long double>(k) / count);
    while (i < sizes.size() && before + sizes[i] / 2 < target) before += sizes[i++];
    const size_t lo = starts.back() + 1;
    const size_t hi = sizes.size() - (count - k);
    size_t start = std::clamp(i, lo, hi);
    while (i < start) before += sizes[i++];
    while (i > start) before -= sizes[--i];
    starts.push_back(start);
  }
  return starts;
}

std::string ShardHeader(const ModelLayout& layout, const PlannedShard& shard) {
  nlohmann::json header = nlohmann::json::object();
  header["__metadata__"] = {{"format", "pt"}};
  const std::string_view dtype = SafetensorsDTypeName(layout.spec.dtype);
  for (size_t index : shard.tensors) {
    const PlannedTensor& t = layout.tensors[index];
    header[t.name] = {{"dtype", dtype}, {"shape", t.shape}, {"data_offsets", {t.begin, t.end}}};
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  const uint64_t length = json.size();
  std::memcpy(out.data(), &length, 8);
  return out + json;
}

void AssignShards(ModelLayout& layout) {
  const size_t count = static_cast<size_t>(layout.spec.shards);
  const size_t esize = ModelDTypeSize(layout.spec.dtype);
  std::vector<uint64_t> sizes;
  for (const PlannedTensor& t : layout.tensors) sizes.push_back(t.element_count * esize);
  const std::vector<size_t> starts = ShardStarts(sizes, count);
  layout.shards.resize(count);
  for (size_t k = 0; k < count; ++k) {
    PlannedShard& shard = layout.shards[k];
    shard.file_name = ShardFileName(k, count);
    const size_t stop = k + 1 < count ? starts[k + 1] : layout.tensors.size();
    for (size_t i = starts[k]; i < stop; ++i) {
      PlannedTensor& t = layout.tensors[i];
      t.shard = k;
      t.begin = shard.data_size;
      t.end = t.begin + sizes[i];
      shard.data_size = t.end;
      shard.tensors.push_back(i);
    }
    shard.header = ShardHeader(layout, shard);
    layout.tensor_bytes += shard.data_size;
    layout.file_bytes += shard.file_size();
  }
}

std::string IndexJson(const ModelLayout& layout) {
  nlohmann::json map = nlohmann::json::object();
  for (const PlannedTensor& t : layout.tensors) map[t.name] = layout.shards[t.shard].file_name;
  nlohmann::json index = {{"metadata", {{"total_size", layout.tensor_bytes}}},
                          {"weight_map", std::move(map)}};
  return index.dump(2) + "\n";
}

}  // namespace

std::string ShardFileName(size_t index, size_t count) {
  if (count == 1) return kSingleFileName;
  char name[64];
  std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", index + 1, count);
  return name;
}

Result<ModelLayout> PlanModel(const ModelSpec& spec) {
  BATON_RETURN_IF_ERROR(ValidateSpec(spec));
  ModelLayout layout;
  layout.spec = spec;
  AddTensors(layout);
  AssignShards(layout);
  if (spec.shards > 1) layout.index_json = IndexJson(layout);
  return layout;
}

void GenerateTensorValues(const PlannedTensor& tensor, uint64_t first, size_t count, float* out) {
  uint64_t state = tensor.key + (first + 1) * kGoldenGamma;
  for (size_t i = 0; i < count; ++i, state += kGoldenGamma) {
    out[i] = tensor.mean + tensor.stddev * UnitNormal(Mix64(state));
  }
}

void FillShardData(const ModelLayout& layout, size_t shard, uint64_t begin, uint64_t end,
                   uint8_t* out) {
  const PlannedShard& s = layout.shards[shard];
  const DType dtype = layout.spec.dtype;
  const size_t esize = ModelDTypeSize(dtype);
  auto it = std::upper_bound(s.tensors.begin(), s.tensors.end(), begin,
                             [&](uint64_t pos, size_t i) { return pos < layout.tensors[i].end; });
  constexpr size_t kChunk = 2048;
  float values[kChunk];
  uint16_t halves[kChunk];
  for (; it != s.tensors.end() && begin < end; ++it) {
    const PlannedTensor& t = layout.tensors[*it];
    const uint64_t stop = std::min(end, t.end);
    uint64_t element = (begin - t.begin) / esize;
    while (begin < stop) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(kChunk, (stop - begin) / esize));
      GenerateTensorValues(t, element, n, values);
      const void* src = values;
      if (dtype == DType::kF16) {
        FloatsToHalf(values, halves, n);
        src = halves;
      } else if (dtype == DType::kBF16) {
        FloatsToBFloat16(values, halves, n);
        src = halves;
      }
      std::memcpy(out, src, n * esize);
      out += n * esize;
      begin += n * esize;
      element += n;
    }
  }
}

}  // namespace baton
