// ModelSpec: the shape of a synthetic Llama-style model written by `baton-mkmodel`, and the
// named presets (tiny, small, 1g, 4g).
//
// The vocabulary is byte-level: ids 0..255 are the bytes, then kBosTokenId, kEosTokenId,
// kPadTokenId and one reserved id (vocab_size 260). Presets other than `tiny` choose their
// layer count so that the weights take about the preset's size in the chosen dtype. A spec
// is a plain value; ValidateSpec() names the first field that is out of range.
// Thread-compatible.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "weightcache/safetensors/dtype.h"

namespace baton {

inline constexpr int kByteVocabSize = 256;
inline constexpr int kBosTokenId = 256;
inline constexpr int kEosTokenId = 257;
inline constexpr int kPadTokenId = 258;
inline constexpr int kSyntheticVocabSize = 260;

struct ModelSpec {
  std::string preset;  // the preset's name, or "custom"
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;
  int num_hidden_layers = 0;
  int vocab_size = kSyntheticVocabSize;
  int max_position_embeddings = 2048;
  double rms_norm_eps = 1e-5;
  double rope_theta = 10000.0;
  DType dtype = DType::kF32;  // kF32, kF16 or kBF16
  uint64_t seed = 0;
  int shards = 1;

  int head_dim() const { return num_attention_heads > 0 ? hidden_size / num_attention_heads : 0; }
  uint64_t parameter_count() const;
  uint64_t tensor_bytes() const;  // parameter_count() x element size
};

// The preset `name` in `dtype`, seed 0, one shard. An unknown name yields a spec with every
// dimension zero, which ValidateSpec (and WriteModel) refuses; ParsePreset says why.
ModelSpec PresetSpec(std::string_view name, DType dtype = DType::kF32);
Result<ModelSpec> ParsePreset(std::string_view name, DType dtype = DType::kF32);
std::vector<std::string> PresetNames();

// Parses "f32", "f16", "bf16" (or the safetensors names F32, F16, BF16).
Result<DType> ParseModelDType(std::string_view text);
// Bytes per element of a supported dtype (4 or 2).
size_t ModelDTypeSize(DType dtype);
// "float32", "float16", "bfloat16" (the `torch_dtype` of config.json).
std::string_view TorchDTypeName(DType dtype);

Status ValidateSpec(const ModelSpec& spec);

// The HF-style config.json for `spec` (pretty-printed, keys sorted, newline-terminated).
std::string ConfigJson(const ModelSpec& spec);

// The spec of a preset model whose config.json is `config_text`: nullopt unless the text is
// exactly what baton-mkmodel writes for some preset, dtype, seed and shard count (so the
// values of every tensor are known, see model_layout.h).
std::optional<ModelSpec> SpecFromConfigJson(std::string_view config_text);

}  // namespace baton
