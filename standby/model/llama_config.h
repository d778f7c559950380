// LlamaConfig: the architecture of a Llama-style decoder, read from a Hugging Face
// config.json.
//
// Parsing accepts the fields of `LlamaForCausalLM` (hidden_size, intermediate_size,
// num_attention_heads, num_key_value_heads, num_hidden_layers, vocab_size, head_dim,
// rms_norm_eps, rope_theta, rope_scaling, max_position_embeddings, tie_word_embeddings,
// bos_token_id, eos_token_id) and refuses what the reference engine does not implement
// (another model_type, an activation other than SiLU, attention or MLP biases, a RoPE
// scaling other than "linear" and "llama3"). Validate() checks sizes and divisibility; every
// refusal names the field and the rule. A plain value; thread-compatible.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace baton {

struct RopeScaling {
  enum class Type { kNone, kLinear, kLlama3 };
  Type type = Type::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0;                 // llama3 only
  double high_freq_factor = 4.0;                // llama3 only
  int original_max_position_embeddings = 8192;  // llama3 only
};

struct LlamaConfig {
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;
  int num_hidden_layers = 0;
  int vocab_size = 0;
  int head_dim = 0;  // hidden_size / num_attention_heads unless config.json says otherwise
  int max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  std::optional<int32_t> bos_token_id;
  std::vector<int32_t> eos_token_ids;  // config.json allows one id or a list

  int q_dim() const { return num_attention_heads * head_dim; }
  int kv_dim() const { return num_key_value_heads * head_dim; }
  int group_size() const { return num_attention_heads / num_key_value_heads; }
  bool IsEos(int32_t token) const;

  // Positive sizes within limits, head counts that divide, an even head_dim (RoPE rotates
  // pairs), special ids inside the vocabulary, positive eps and theta.
  Status Validate() const;
};

// Parses and validates config.json text; `name` is used in messages.
Result<LlamaConfig> ParseLlamaConfig(std::string_view json_text,
                                     std::string_view name = "config.json");

// Reads `path`: a config.json file, or a model directory holding one. A FIFO, a device or a
// file over 16 MiB in its place is refused (InvalidArgument), never waited on or read whole.
Result<LlamaConfig> LoadLlamaConfig(const std::string& path);

}  // namespace baton
