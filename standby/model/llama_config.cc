#include "standby/model/llama_config.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "base/io/unique_fd.h"

namespace baton {
namespace {

using nlohmann::json;

constexpr int kMaxDimension = 1 << 20;
constexpr int kMaxLayers = 4096;
constexpr int kMaxVocab = 1 << 24;
constexpr int kMaxHeadDim = 1024;
// A Llama's config.json is a few KiB; anything near this is not one.
constexpr uint64_t kMaxConfigBytes = 16u << 20;

// Reads the integer field `key` into `out`; absent keeps `out` unless `required`.
Status ReadInt(const json& j, const char* key, bool required, int* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) return InvalidArgument(std::string("missing required field '") + key + "'");
    return OkStatus();
  }
  if (!it->is_number_integer()) {
    return InvalidArgument(std::string("field '") + key + "' must be an integer");
  }
  const int64_t v = it->get<int64_t>();
  if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max()) {
    return InvalidArgument(std::string("field '") + key + "' = " + std::to_string(v) +
                           " is out of range");
  }
  *out = static_cast<int>(v);
  return OkStatus();
}

Status ReadDouble(const json& j, const char* key, double* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return OkStatus();
  if (!it->is_number()) return InvalidArgument(std::string("field '") + key + "' must be a number");
  *out = it->get<double>();
  return OkStatus();
}

Status ReadBool(const json& j, const char* key, bool* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return OkStatus();
  if (!it->is_boolean()) return InvalidArgument(std::string("field '") + key + "' must be a bool");
  *out = it->get<bool>();
  return OkStatus();
}

Status ReadTokenIds(const json& j, const char* key, std::vector<int32_t>* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return OkStatus();
  const json list = it->is_array() ? *it : json::array({*it});
  for (const json& v : list) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
        v.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      return InvalidArgument(std::string("field '") + key +
                             "' must be a non-negative integer or a list of them");
    }
    out->push_back(static_cast<int32_t>(v.get<int64_t>()));
  }
  return OkStatus();
}

// Fields whose presence with a non-default value means an architecture we do not run.
Status CheckSupported(const json& j) {
  if (auto it = j.find("model_type"); it != j.end() && *it != "llama") {
    return Unimplemented("model_type " + it->dump() + " is not supported (only \"llama\")");
  }
  if (auto it = j.find("hidden_act"); it != j.end() && *it != "silu") {
    return Unimplemented("hidden_act " + it->dump() + " is not supported (only \"silu\")");
  }
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    if (auto it = j.find(key); it != j.end() && *it == true) {
      return Unimplemented(std::string(key) + " = true is not supported");
    }
  }
  return OkStatus();
}

Status ParseRopeScaling(const json& j, RopeScaling* out) {
  auto it = j.find("rope_scaling");
  if (it == j.end() || it->is_null()) return OkStatus();
  if (!it->is_object()) return InvalidArgument("field 'rope_scaling' must be an object or null");
  const json& rs = *it;
  std::string type;
  for (const char* key : {"rope_type", "type"}) {
    if (auto t = rs.find(key); t != rs.end() && t->is_string()) type = t->get<std::string>();
    if (!type.empty()) break;
  }
  if (type == "default") return OkStatus();
  if (type == "linear") {
    out->type = RopeScaling::Type::kLinear;
  } else if (type == "llama3") {
    out->type = RopeScaling::Type::kLlama3;
  } else {
    return Unimplemented("rope_scaling type '" + type + "' is not supported (linear, llama3)");
  }
  BATON_RETURN_IF_ERROR(ReadDouble(rs, "factor", &out->factor));
  BATON_RETURN_IF_ERROR(ReadDouble(rs, "low_freq_factor", &out->low_freq_factor));
  BATON_RETURN_IF_ERROR(ReadDouble(rs, "high_freq_factor", &out->high_freq_factor));
  BATON_RETURN_IF_ERROR(ReadInt(rs, "original_max_position_embeddings", false,
                                &out->original_max_position_embeddings));
  return OkStatus();
}

Status ParseFields(const json& j, LlamaConfig* c) {
  BATON_RETURN_IF_ERROR(CheckSupported(j));
  BATON_RETURN_IF_ERROR(ReadInt(j, "hidden_size", true, &c->hidden_size));
  BATON_RETURN_IF_ERROR(ReadInt(j, "intermediate_size", true, &c->intermediate_size));
  BATON_RETURN_IF_ERROR(ReadInt(j, "num_attention_heads", true, &c->num_attention_heads));
  c->num_key_value_heads = c->num_attention_heads;
  BATON_RETURN_IF_ERROR(ReadInt(j, "num_key_value_heads", false, &c->num_key_value_heads));
  BATON_RETURN_IF_ERROR(ReadInt(j, "num_hidden_layers", true, &c->num_hidden_layers));
  BATON_RETURN_IF_ERROR(ReadInt(j, "vocab_size", true, &c->vocab_size));
  if (c->num_attention_heads > 0) c->head_dim = c->hidden_size / c->num_attention_heads;
  BATON_RETURN_IF_ERROR(ReadInt(j, "head_dim", false, &c->head_dim));
  BATON_RETURN_IF_ERROR(ReadInt(j, "max_position_embeddings", false, &c->max_position_embeddings));
  BATON_RETURN_IF_ERROR(ReadDouble(j, "rms_norm_eps", &c->rms_norm_eps));
  BATON_RETURN_IF_ERROR(ReadDouble(j, "rope_theta", &c->rope_theta));
  BATON_RETURN_IF_ERROR(ParseRopeScaling(j, &c->rope_scaling));
  BATON_RETURN_IF_ERROR(ReadBool(j, "tie_word_embeddings", &c->tie_word_embeddings));
  std::vector<int32_t> bos;
  BATON_RETURN_IF_ERROR(ReadTokenIds(j, "bos_token_id", &bos));
  if (bos.size() > 1) return InvalidArgument("field 'bos_token_id' must be a single id");
  if (!bos.empty()) c->bos_token_id = bos[0];
  return ReadTokenIds(j, "eos_token_id", &c->eos_token_ids);
}

Status InRange(const char* field, int value, int lo, int hi) {
  if (value >= lo && value <= hi) return OkStatus();
  return InvalidArgument(std::string(field) + " = " + std::to_string(value) + " is outside [" +
                         std::to_string(lo) + ", " + std::to_string(hi) + "]");
}

Status NotMultiple(const char* a, int av, const char* b, int bv) {
  return InvalidArgument(std::string(a) + " " + std::to_string(av) + " is not a multiple of " + b +
                         " " + std::to_string(bv));
}

}  // namespace

bool LlamaConfig::IsEos(int32_t token) const {
  return std::find(eos_token_ids.begin(), eos_token_ids.end(), token) != eos_token_ids.end();
}

Status LlamaConfig::Validate() const {
  BATON_RETURN_IF_ERROR(InRange("hidden_size", hidden_size, 1, kMaxDimension));
  BATON_RETURN_IF_ERROR(InRange("intermediate_size", intermediate_size, 1, kMaxDimension));
  BATON_RETURN_IF_ERROR(InRange("num_attention_heads", num_attention_heads, 1, kMaxDimension));
  BATON_RETURN_IF_ERROR(
      InRange("num_key_value_heads", num_key_value_heads, 1, num_attention_heads));
  BATON_RETURN_IF_ERROR(InRange("num_hidden_layers", num_hidden_layers, 1, kMaxLayers));
  BATON_RETURN_IF_ERROR(InRange("vocab_size", vocab_size, 1, kMaxVocab));
  BATON_RETURN_IF_ERROR(InRange("head_dim", head_dim, 2, kMaxHeadDim));
  BATON_RETURN_IF_ERROR(InRange("max_position_embeddings", max_position_embeddings, 1, 1 << 24));
  if (num_attention_heads % num_key_value_heads != 0) {
    return NotMultiple("num_attention_heads", num_attention_heads, "num_key_value_heads",
                       num_key_value_heads);
  }
  if (head_dim % 2 != 0)
    return InvalidArgument("head_dim " + std::to_string(head_dim) +
                           " must be even (RoPE rotates pairs)");
  if (static_cast<int64_t>(num_attention_heads) * head_dim > kMaxDimension) {
    return InvalidArgument("num_attention_heads x head_dim exceeds " +
                           std::to_string(kMaxDimension));
  }
  if (!(rms_norm_eps > 0)) return InvalidArgument("rms_norm_eps must be positive");
  if (!(rope_theta > 1)) return InvalidArgument("rope_theta must be greater than 1");
  if (rope_scaling.type != RopeScaling::Type::kNone && !(rope_scaling.factor > 0)) {
    return InvalidArgument("rope_scaling.factor must be positive");
  }
  if (rope_scaling.type == RopeScaling::Type::kLlama3 &&
      !(rope_scaling.high_freq_factor > rope_scaling.low_freq_factor &&
        rope_scaling.low_freq_factor > 0 && rope_scaling.original_max_position_embeddings > 0)) {
    return InvalidArgument(
        "rope_scaling: llama3 needs high_freq_factor > low_freq_factor > 0 and a positive "
        "original_max_position_embeddings");
  }
  if (bos_token_id && *bos_token_id >= vocab_size) {
    return InvalidArgument("bos_token_id " + std::to_string(*bos_token_id) +
                           " is outside the vocabulary of " + std::to_string(vocab_size));
  }
  for (int32_t id : eos_token_ids) {
    if (id >= vocab_size) {
      return InvalidArgument("eos_token_id " + std::to_string(id) +
                             " is outside the vocabulary of " + std::to_string(vocab_size));
    }
  }
  return OkStatus();
}

Result<LlamaConfig> ParseLlamaConfig(std::string_view json_text, std::string_view name) {
  const std::string prefix = std::string(name) + ": ";
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    return InvalidArgument(prefix + "not valid JSON: " + e.what());
  }
  if (!j.is_object()) return InvalidArgument(prefix + "top level is not a JSON object");
  LlamaConfig config;
  Status s;
  try {
    s = ParseFields(j, &config);
  } catch (const json::exception& e) {
    s = InvalidArgument(e.what());
  }
  if (s.ok()) s = config.Validate();
  if (!s.ok()) return Status(s.code(), prefix + s.message());
  return config;
}

Result<LlamaConfig> LoadLlamaConfig(const std::string& path) {
  std::error_code ec;
  std::string file = path;
  if (std::filesystem::is_directory(path, ec)) file = path + "/config.json";
  // O_NONBLOCK: a FIFO in its place is refused below, not waited on.
  UniqueFd fd(::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (!fd) return NotFound(file + ": cannot open model config: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(file + ": fstat", errno);
  if (!S_ISREG(st.st_mode))
    return InvalidArgument(file + ": the model config is not a regular file");
  if (static_cast<uint64_t>(st.st_size) > kMaxConfigBytes) {
    return InvalidArgument(file + ": the model config is " + std::to_string(st.st_size) +
                           " bytes, over the limit of " + std::to_string(kMaxConfigBytes));
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::read(fd.get(), text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus(file + ": read", errno);
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  text.resize(got);
  return ParseLlamaConfig(text, file);
}

}  // namespace baton
