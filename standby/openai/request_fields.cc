#include "standby/openai/request_fields.h"

#include <cstdint>

#include "standby/model/llama_config.h"

namespace baton {

using Json = nlohmann::json;

ApiError ParamError(std::string param, std::string message) {
  return MakeApiError(400, std::move(message), std::move(param));
}

ApiError NotSupported(const std::string& name, const std::string& only) {
  return ParamError(name, "'" + name + "' is not supported by this engine (only " + only + ")");
}

bool IsJsonInteger(const Json& j) { return j.is_number_integer() || j.is_number_unsigned(); }

std::optional<ApiError> ReadInt(const Json& body, const char* name, int64_t* out, bool* present) {
  *present = false;
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!IsJsonInteger(*it)) {
    return ParamError(name, std::string("'") + name + "' must be an integer");
  }
  if (it->is_number_unsigned() && it->get<uint64_t>() > INT64_MAX) {
    return ParamError(name, std::string("'") + name + "' is out of range");
  }
  *out = it->get<int64_t>();
  *present = true;
  return std::nullopt;
}

std::optional<ApiError> ReadNumber(const Json& body, const char* name, double lo, double hi,
                                   bool lo_open, const char* range, float* out) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) return ParamError(name, std::string("'") + name + "' must be a number");
  const double v = it->get<double>();
  if (!(v <= hi) || (lo_open ? !(v > lo) : !(v >= lo))) {
    return ParamError(name, std::string("'") + name + "' must be in " + range);
  }
  *out = static_cast<float>(v);
  return std::nullopt;
}

std::optional<ApiError> ReadBool(const Json& body, const char* name, bool* out) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) return ParamError(name, std::string("'") + name + "' must be a boolean");
  *out = it->get<bool>();
  return std::nullopt;
}

namespace {

std::optional<ApiError> ReadStopTokenIds(const Json& body, const CompletionContext& ctx,
                                         std::vector<int32_t>* out) {
  auto it = body.find("stop_token_ids");
  if (it == body.end() || it->is_null()) return std::nullopt;
  const std::string what = "'stop_token_ids' must be an array of at most " +
                           std::to_string(kMaxStopTokenIds) + " token ids in [0, " +
                           std::to_string(ctx.config->vocab_size) + ")";
  if (!it->is_array() || it->size() > kMaxStopTokenIds) return ParamError("stop_token_ids", what);
  for (const Json& id : *it) {
    const bool in_vocab = IsJsonInteger(id) && !(id.is_number_unsigned() && id > INT32_MAX) &&
                          id.get<int64_t>() >= 0 && id.get<int64_t>() < ctx.config->vocab_size;
    if (!in_vocab) {
      return ParamError("stop_token_ids", what);
    }
    out->push_back(static_cast<int32_t>(id.get<int64_t>()));
  }
  return std::nullopt;
}

// vLLM's sampling knobs this engine does not implement: refused unless neutral.
std::optional<ApiError> ReadUnimplementedVllm(const Json& body) {
  int64_t top_k = -1;
  bool present = false;
  if (auto e = ReadInt(body, "top_k", &top_k, &present)) return e;
  if (top_k != -1 && top_k != 0) return NotSupported("top_k", "-1 or 0: every token");
  float unused = 0;
  if (auto e = ReadNumber(body, "min_p", 0, 1, false, "[0, 1]", &unused)) return e;
  if (auto e = ReadNumber(body, "repetition_penalty", 0, 1e9, true, "(0, inf)", &unused)) {
    return e;
  }
  // Compared as given, not as a float: 1e-50 is no 0.
  auto neutral = [&body](const char* name, double value) {
    auto it = body.find(name);
    return it == body.end() || it->is_null() || it->get<double>() == value;
  };
  if (!neutral("min_p", 0)) return NotSupported("min_p", "0");
  if (!neutral("repetition_penalty", 1)) return NotSupported("repetition_penalty", "1");
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> ReadVllmParams(const Json& body, const CompletionContext& ctx,
                                       CompletionRequest* req) {
  int64_t min_tokens = 0;
  bool present = false;
  if (auto e = ReadInt(body, "min_tokens", &min_tokens, &present)) return e;
  if (min_tokens < 0 || min_tokens > req->max_tokens) {
    return ParamError("min_tokens", "'min_tokens' must be in [0, max_tokens = " +
                                        std::to_string(req->max_tokens) + "]");
  }
  req->min_tokens = static_cast<int>(min_tokens);
  if (auto e = ReadBool(body, "ignore_eos", &req->ignore_eos)) return e;
  if (auto e = ReadStopTokenIds(body, ctx, &req->stop_token_ids)) return e;
  return ReadUnimplementedVllm(body);
}

}  // namespace baton
