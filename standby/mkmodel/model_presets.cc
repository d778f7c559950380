#include "standby/mkmodel/model_presets.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

namespace baton {
namespace {

constexpr int kMaxDimension = 1 << 20;
constexpr int kMaxLayers = 4096;

struct Preset {
  std::string_view name;
  int hidden, intermediate, heads, kv_heads, layers;  // layers 0: sized from target_bytes
  int max_positions;
  uint64_t target_bytes;
};

constexpr Preset kPresets[] = {
    {"tiny", 64, 192, 4, 2, 2, 512, 0},
    {"small", 512, 1536, 8, 4, 0, 2048, 256ull << 20},
    {"1g", 2048, 5632, 32, 4, 0, 2048, 1ull << 30},
    {"4g", 2048, 5632, 32, 4, 0, 2048, 4ull << 30},
};

uint64_t LayerParameters(const ModelSpec& s) {
  const uint64_t h = s.hidden_size;
  const uint64_t kv = static_cast<uint64_t>(s.num_key_value_heads) * s.head_dim();
  const uint64_t attention = h * h * 2 + kv * h * 2;  // q, o, k, v
  const uint64_t mlp = 3ull * s.intermediate_size * h;
  return attention + mlp + 2 * h;  // two norms
}

uint64_t FixedParameters(const ModelSpec& s) {
  return 2ull * s.vocab_size * s.hidden_size + s.hidden_size;  // embed, lm_head, final norm
}

}  // namespace

uint64_t ModelSpec::parameter_count() const {
  return FixedParameters(*this) + LayerParameters(*this) * static_cast<uint64_t>(num_hidden_layers);
}

uint64_t ModelSpec::tensor_bytes() const { return parameter_count() * ModelDTypeSize(dtype); }

ModelSpec PresetSpec(std::string_view name, DType dtype) {
  ModelSpec spec;
  spec.preset = std::string(name);
  spec.dtype = dtype;
  for (const Preset& p : kPresets) {
    if (p.name != name) continue;
    spec.hidden_size = p.hidden;
    spec.intermediate_size = p.intermediate;
    spec.num_attention_heads = p.heads;
    spec.num_key_value_heads = p.kv_heads;
    spec.max_position_embeddings = p.max_positions;
    spec.num_hidden_layers = p.layers;
    if (p.layers == 0) {
      const double elements = static_cast<double>(p.target_bytes) / ModelDTypeSize(dtype);
      const double layers = (elements - static_cast<double>(FixedParameters(spec))) /
                            static_cast<double>(LayerParameters(spec));
      spec.num_hidden_layers = std::max(1, static_cast<int>(std::lround(layers)));
    }
    return spec;
  }
  spec.hidden_size = spec.intermediate_size = 0;
  spec.num_attention_heads = spec.num_key_value_heads = spec.num_hidden_layers = 0;
  return spec;
}

Result<ModelSpec> ParsePreset(std::string_view name, DType dtype) {
  ModelSpec spec = PresetSpec(name, dtype);
  if (spec.hidden_size == 0) {
    std::string known;
    for (const std::string& n : PresetNames()) known += (known.empty() ? "" : ", ") + n;
    return InvalidArgument("unknown model preset '" + std::string(name) + "' (known: " + known +
                           ")");
  }
  BATON_RETURN_IF_ERROR(ValidateSpec(spec));
  return spec;
}

std::vector<std::string> PresetNames() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.emplace_back(p.name);
  return names;
}

Result<DType> ParseModelDType(std::string_view text) {
  if (text == "f32" || text == "F32" || text == "float32") return DType::kF32;
  if (text == "f16" || text == "F16" || text == "float16") return DType::kF16;
  if (text == "bf16" || text == "BF16" || text == "bfloat16") return DType::kBF16;
  return InvalidArgument("unsupported model dtype '" + std::string(text) +
                         "' (supported: f32, f16, bf16)");
}

size_t ModelDTypeSize(DType dtype) { return dtype == DType::kF32 ? 4 : 2; }

std::string_view TorchDTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "float32";
    case DType::kF16:
      return "float16";
    case DType::kBF16:
      return "bfloat16";
    default:
      return "unsupported";
  }
}

Status ValidateSpec(const ModelSpec& s) {
  auto in_range = [](const char* field, int value, int lo, int hi) -> Status {
    if (value >= lo && value <= hi) return OkStatus();
    return InvalidArgument(std::string("model spec: ") + field + " = " + std::to_string(value) +
                           " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  };
  BATON_RETURN_IF_ERROR(in_range("hidden_size", s.hidden_size, 1, kMaxDimension));
  BATON_RETURN_IF_ERROR(in_range("intermediate_size", s.intermediate_size, 1, kMaxDimension));
  BATON_RETURN_IF_ERROR(in_range("num_attention_heads", s.num_attention_heads, 1, s.hidden_size));
  BATON_RETURN_IF_ERROR(
      in_range("num_key_value_heads", s.num_key_value_heads, 1, s.num_attention_heads));
  BATON_RETURN_IF_ERROR(in_range("num_hidden_layers", s.num_hidden_layers, 1, kMaxLayers));
  BATON_RETURN_IF_ERROR(in_range("vocab_size", s.vocab_size, kPadTokenId + 1, kMaxDimension));
  BATON_RETURN_IF_ERROR(
      in_range("max_position_embeddings", s.max_position_embeddings, 1, kMaxDimension));
  if (s.hidden_size % s.num_attention_heads != 0) {
    return InvalidArgument("model spec: hidden_size " + std::to_string(s.hidden_size) +
                           " is not a multiple of num_attention_heads " +
                           std::to_string(s.num_attention_heads));
  }
  if (s.num_attention_heads % s.num_key_value_heads != 0) {
    return InvalidArgument(
        "model spec: num_attention_heads " + std::to_string(s.num_attention_heads) +
        " is not a multiple of num_key_value_heads " + std::to_string(s.num_key_value_heads));
  }
  if (s.dtype != DType::kF32 && s.dtype != DType::kF16 && s.dtype != DType::kBF16) {
    return InvalidArgument("model spec: dtype must be F32, F16 or BF16");
  }
  if (!(s.rms_norm_eps > 0) || !(s.rope_theta > 0)) {
    return InvalidArgument("model spec: rms_norm_eps and rope_theta must be positive");
  }
  const int tensors = 3 + 9 * s.num_hidden_layers;
  BATON_RETURN_IF_ERROR(in_range("shards", s.shards, 1, std::min(tensors, 99999)));
  return OkStatus();
}

std::string ConfigJson(const ModelSpec& s) {
  nlohmann::json config = {
      {"architectures", {"LlamaForCausalLM"}},
      {"model_type", "llama"},
      {"hidden_size", s.hidden_size},
      {"intermediate_size", s.intermediate_size},
      {"num_attention_heads", s.num_attention_heads},
      {"num_key_value_heads", s.num_key_value_heads},
      {"num_hidden_layers", s.num_hidden_layers},
      {"head_dim", s.head_dim()},
      {"vocab_size", s.vocab_size},
      {"rms_norm_eps", s.rms_norm_eps},
      {"rope_theta", s.rope_theta},
      {"max_position_embeddings", s.max_position_embeddings},
      {"hidden_act", "silu"},
      {"attention_bias", false},
      {"mlp_bias", false},
      {"torch_dtype", TorchDTypeName(s.dtype)},
      {"tie_word_embeddings", false},
      {"bos_token_id", kBosTokenId},
      {"eos_token_id", kEosTokenId},
      {"pad_token_id", kPadTokenId},
      {"baton",
       {{"generator", "baton-mkmodel"},
        {"preset", s.preset},
        {"seed", s.seed},
        {"shards", s.shards},
        {"tokenizer", "bytes"}}},
  };
  return config.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

std::optional<ModelSpec> SpecFromConfigJson(std::string_view config_text) {
  const nlohmann::json config = nlohmann::json::parse(config_text, nullptr, false);
  if (!config.is_object()) return std::nullopt;
  const auto baton = config.find("baton");
  const auto torch_dtype = config.find("torch_dtype");
  if (baton == config.end() || !baton->is_object() || torch_dtype == config.end() ||
      !torch_dtype->is_string()) {
    return std::nullopt;
  }
  const auto preset = baton->find("preset");
  const auto seed = baton->find("seed");
  const auto shards = baton->find("shards");
  if (preset == baton->end() || !preset->is_string() || seed == baton->end() ||
      !seed->is_number_unsigned() || shards == baton->end() || !shards->is_number_integer()) {
    return std::nullopt;
  }
  const Result<DType> dtype = ParseModelDType(torch_dtype->get<std::string>());
  if (!dtype.ok()) return std::nullopt;
  ModelSpec spec = PresetSpec(preset->get<std::string>(), *dtype);
  spec.seed = seed->get<uint64_t>();
  const int64_t count = shards->get<int64_t>();
  if (count < 1 || count > 99999) return std::nullopt;
  spec.shards = static_cast<int>(count);
  if (!ValidateSpec(spec).ok() || ConfigJson(spec) != config_text) return std::nullopt;
  return spec;
}

}  // namespace baton
