#include "standby/openai/completions_api.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "base/text/json_depth.h"
#include "standby/openai/chat_api.h"
#include "standby/openai/completion_json.h"
#include "standby/openai/request_fields.h"

namespace baton {
namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

bool AllIntegers(const Json& array) {
  return std::all_of(array.begin(), array.end(), [](const Json& e) { return IsJsonInteger(e); });
}

std::optional<ApiError> ReadIds(const Json& array, const CompletionContext& ctx,
                                std::vector<int32_t>* out) {
  const int64_t vocab = ctx.config->vocab_size;
  for (const Json& e : array) {
    const bool in_range = e.is_number_unsigned()
                              ? e.get<uint64_t>() < static_cast<uint64_t>(vocab)
                              : e.get<int64_t>() >= 0 && e.get<int64_t>() < vocab;
    if (!in_range) {
      return ParamError("prompt", "token id " + e.dump() + " is outside the vocabulary [0, " +
                                      std::to_string(vocab) + ")");
    }
    out->push_back(static_cast<int32_t>(e.get<int64_t>()));
  }
  return std::nullopt;
}

std::optional<ApiError> CheckPromptLength(const std::vector<int32_t>& ids,
                                          const CompletionContext& ctx, const char* param) {
  if (ids.empty()) return ParamError(param, "'prompt' is empty");
  const int64_t limit = ctx.config->max_position_embeddings;
  if (static_cast<int64_t>(ids.size()) >= limit) {
    return ParamError(param, "the prompt is " + std::to_string(ids.size()) +
                                 " tokens; this model's maximum context length is " +
                                 std::to_string(limit) + " tokens");
  }
  return std::nullopt;
}

std::optional<ApiError> ReadPrompt(const Json& body, const CompletionContext& ctx,
                                   std::vector<int32_t>* out) {
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) {
    ApiError e = ParamError("prompt", "'prompt' is required");
    e.code = "missing_required_parameter";  // as for a chat request's 'messages'
    return e;
  }
  const Json* prompt = &*it;
  if (prompt->is_array() && prompt->size() == 1 && !IsJsonInteger((*prompt)[0])) {
    prompt = &(*prompt)[0];  // a batch of one: a string or an array of ids
  }
  if (prompt->is_string()) {
    const bool bos = ctx.tokenizer->bos_token_id().has_value();
    *out = ctx.tokenizer->Encode(prompt->get_ref<const std::string&>(), bos);
  } else if (prompt->is_array() && AllIntegers(*prompt)) {
    if (auto e = ReadIds(*prompt, ctx, out)) return e;
  } else if (prompt->is_array()) {
    return ParamError("prompt",
                      "'prompt' must be a string or an array of token ids (batched "
                      "prompts are not supported)");
  } else {
    return ParamError("prompt", "'prompt' must be a string or an array of token ids");
  }
  return CheckPromptLength(*out, ctx, "prompt");
}

// The length limit: `max_tokens`, or for chat `max_completion_tokens` first. Absent, it is
// 16 (OpenAI's default for completions) cut to the room left in the context; for chat, and
// for a router's replay of a chat stream (`baton_resume_tokens` > 0 without a limit), the
// room.
std::optional<ApiError> ReadMaxTokens(const Json& body, const CompletionContext& ctx,
                                      CompletionRequest* req) {
  const int64_t room =
      ctx.config->max_position_embeddings - static_cast<int64_t>(req->prompt_ids.size());
  int64_t value = 16;
  bool present = false;
  const char* name = "max_tokens";
  if (req->chat) {
    if (auto e = ReadInt(body, "max_completion_tokens", &value, &present)) return e;
    if (present) name = "max_completion_tokens";
  }
  if (!present) {
    if (auto e = ReadInt(body, "max_tokens", &value, &present)) return e;
  }
  if (!present) {
    const bool whole_room = req->chat || req->resume_tokens > 0;  // ReadResume ran first
    req->max_tokens = static_cast<int>(whole_room ? room : std::min<int64_t>(16, room));
    return std::nullopt;
  }
  if (value < 1) return ParamError(name, std::string("'") + name + "' must be at least 1");
  if (value > room) {
    return ParamError(name, "this model's maximum context length is " +
                                std::to_string(ctx.config->max_position_embeddings) + " tokens; " +
                                std::to_string(req->prompt_ids.size()) + " in the prompt and " +
                                std::to_string(value) + " in " + name + " exceed it");
  }
  req->max_tokens = static_cast<int>(value);
  return std::nullopt;
}

std::optional<ApiError> ReadStop(const Json& body, std::vector<std::string>* out) {
  auto it = body.find("stop");
  if (it == body.end() || it->is_null()) return std::nullopt;
  const char* kWhat = "'stop' must be a string or an array of at most 4 non-empty strings";
  if (it->is_string()) {
    out->push_back(it->get<std::string>());
  } else if (it->is_array() && it->size() <= kMaxStopStrings) {
    for (const Json& s : *it) {
      if (!s.is_string()) return ParamError("stop", kWhat);
      out->push_back(s.get<std::string>());
    }
  } else {
    return ParamError("stop", kWhat);
  }
  for (const std::string& s : *out) {
    if (s.empty() || s.size() > kMaxStopBytes) return ParamError("stop", kWhat);
  }
  return std::nullopt;
}

std::optional<ApiError> ReadUnsupported(const Json& body) {
  int64_t n = 1;
  bool present = false;
  if (auto e = ReadInt(body, "n", &n, &present)) return e;
  if (n != 1) return ParamError("n", "only 'n' = 1 is supported");
  auto logprobs = body.find("logprobs");
  if (logprobs != body.end() && !logprobs->is_null() && *logprobs != false && *logprobs != 0) {
    return ParamError("logprobs", "'logprobs' is not supported");
  }
  bool echo = false;
  if (auto e = ReadBool(body, "echo", &echo)) return e;
  if (echo) return ParamError("echo", "'echo' is not supported");
  return std::nullopt;
}

// Parameters of OpenAI's API that this engine does not implement: each is checked for its
// type and range, and any value but the one that changes nothing is refused, never ignored.
std::optional<ApiError> ReadUnimplemented(const Json& body, bool chat) {
  for (const char* name : {"presence_penalty", "frequency_penalty"}) {
    float v = 0;
    if (auto e = ReadNumber(body, name, -2, 2, false, "[-2, 2]", &v)) return e;
    if (v != 0) return NotSupported(name, "0");
  }
  auto it = body.find("logit_bias");
  if (it != body.end() && !it->is_null()) {
    if (!it->is_object()) return ParamError("logit_bias", "'logit_bias' must be an object");
    if (!it->empty()) return NotSupported("logit_bias", "{}");
  }
  for (const char* name : {"tools", "functions"}) {
    it = body.find(name);
    if (it == body.end() || it->is_null()) continue;
    if (!it->is_array()) return ParamError(name, std::string("'") + name + "' must be an array");
    if (!it->empty()) return NotSupported(name, "[]");
  }
  it = body.find("tool_choice");
  if (it != body.end() && !it->is_null() && *it != "none")
    return NotSupported("tool_choice", "\"none\"");
  it = body.find("response_format");
  if (it != body.end() && !it->is_null()) {
    if (!it->is_object())
      return ParamError("response_format", "'response_format' must be an object");
    if (it->value("type", Json()) != "text")
      return NotSupported("response_format", "{\"type\": \"text\"}");
  }
  it = body.find("user");
  if (it != body.end() && !it->is_null() && !it->is_string()) {
    return ParamError("user", "'user' must be a string");
  }
  int64_t v = 0;
  bool present = false;
  if (chat) {
    if (auto e = ReadInt(body, "top_logprobs", &v, &present)) return e;
    if (v < 0 || v > 20) return ParamError("top_logprobs", "'top_logprobs' must be in [0, 20]");
    if (v != 0) return NotSupported("top_logprobs", "0");
    return std::nullopt;
  }
  v = 1;
  if (auto e = ReadInt(body, "best_of", &v, &present)) return e;
  if (v < 1) return ParamError("best_of", "'best_of' must be at least 1");
  if (v != 1) return NotSupported("best_of", "1");
  it = body.find("suffix");
  if (it != body.end() && !it->is_null()) {
    if (!it->is_string()) return ParamError("suffix", "'suffix' must be a string");
    if (!it->get_ref<const std::string&>().empty()) return NotSupported("suffix", "\"\"");
  }
  return std::nullopt;
}

std::optional<ApiError> ReadModel(const Json& body, const CompletionContext& ctx,
                                  CompletionRequest* req) {
  req->model = ctx.served_model_name;
  auto it = body.find("model");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) return ParamError("model", "'model' must be a string");
  if (it->get_ref<const std::string&>() != ctx.served_model_name) {
    ApiError e =
        MakeApiError(404, "the model '" + it->get<std::string>() + "' does not exist", "model");
    e.code = "model_not_found";
    return e;
  }
  return std::nullopt;
}

std::optional<ApiError> ReadSampling(const Json& body, const CompletionContext& ctx,
                                     CompletionRequest* req) {
  if (auto e = ReadNumber(body, "temperature", 0, 2, false, "[0, 2]", &req->temperature)) return e;
  if (auto e = ReadNumber(body, "top_p", 0, 1, true, "(0, 1]", &req->top_p)) return e;
  req->seed = ctx.random_seed;
  auto seed = body.find("seed");
  if (seed == body.end() || seed->is_null()) return std::nullopt;
  if (!IsJsonInteger(*seed)) return ParamError("seed", "'seed' must be an integer");
  // Any 64-bit integer; a negative one stands for its two's complement.
  req->seed = seed->is_number_unsigned() ? seed->get<uint64_t>()
                                         : static_cast<uint64_t>(seed->get<int64_t>());
  req->seed_given = true;
  return std::nullopt;
}

std::optional<ApiError> ReadStreaming(const Json& body, CompletionRequest* req) {
  if (auto e = ReadBool(body, "stream", &req->stream)) return e;
  bool ids = true;
  if (auto e = ReadBool(body, "return_token_ids", &ids)) return e;
  auto opts = body.find("stream_options");
  if (opts == body.end() || opts->is_null()) return std::nullopt;
  if (!opts->is_object()) return ParamError("stream_options", "'stream_options' must be an object");
  return ReadBool(*opts, "include_usage", &req->include_usage);
}

std::optional<ApiError> ReadResume(const Json& body, CompletionRequest* req) {
  int64_t k = 0;
  bool present = false;
  if (auto e = ReadInt(body, "baton_resume_tokens", &k, &present)) return e;
  if (k < 0 || k >= static_cast<int64_t>(req->prompt_ids.size())) {
    return ParamError("baton_resume_tokens",
                      "'baton_resume_tokens' must be at least 0 and less than the prompt's " +
                          std::to_string(req->prompt_ids.size()) + " tokens");
  }
  req->resume_tokens = static_cast<int>(k);
  auto key = body.find("baton_request_key");
  if (key == body.end() || key->is_null()) return std::nullopt;
  std::optional<KvRequestKey> parsed;
  if (key->is_string()) parsed = KvRequestKey::FromHex(key->get<std::string>());
  if (!parsed) {
    return ParamError("baton_request_key",
                      "'baton_request_key' must be 32 hex digits, not all zero");
  }
  req->key = *parsed;
  return std::nullopt;
}

// The prompt of a chat request: its messages through the chat template (chat_api.h).
std::optional<ApiError> ReadMessages(const Json& body, const CompletionContext& ctx,
                                     std::vector<int32_t>* out) {
  auto it = body.find("messages");
  if (it == body.end() || it->is_null()) {
    ApiError e = ParamError("messages", "Missing required parameter: 'messages'.");
    e.code = "missing_required_parameter";
    return e;
  }
  std::string text;
  if (auto e = RenderChatPrompt(*it, &text)) return e;
  *out = ctx.tokenizer->Encode(text, ctx.tokenizer->bos_token_id().has_value());
  return CheckPromptLength(*out, ctx, "messages");
}

std::optional<ApiError> ParseFields(const Json& body, const CompletionContext& ctx,
                                    CompletionRequest* req) {
  if (auto e = ReadModel(body, ctx, req)) return e;
  if (auto e = req->chat ? ReadMessages(body, ctx, &req->prompt_ids)
                         : ReadPrompt(body, ctx, &req->prompt_ids)) {
    return e;
  }
  if (auto e = ReadResume(body, req)) return e;
  if (auto e = ReadMaxTokens(body, ctx, req)) return e;
  if (auto e = ReadSampling(body, ctx, req)) return e;
  if (auto e = ReadStreaming(body, req)) return e;
  if (auto e = ReadStop(body, &req->stop)) return e;
  if (auto e = ReadVllmParams(body, ctx, req)) return e;
  if (auto e = ReadUnimplemented(body, req->chat)) return e;
  return ReadUnsupported(body);
}

}  // namespace

std::string ErrorBody(const ApiError& error) {
  OrderedJson inner;
  inner["message"] = error.message;
  inner["type"] = error.type;
  inner["param"] = error.param.empty() ? OrderedJson(nullptr) : OrderedJson(error.param);
  inner["code"] = error.code.empty() ? OrderedJson(nullptr) : OrderedJson(error.code);
  OrderedJson j;
  j["error"] = std::move(inner);
  return DumpJson(j);
}

ApiError MakeApiError(int http_status, std::string message, std::string param) {
  ApiError e;
  e.http_status = http_status;
  e.message = std::move(message);
  e.param = std::move(param);
  if (http_status == 404) e.type = "not_found_error";
  if (http_status == 429) e.type = "rate_limit_error";
  if (http_status >= 500) e.type = "server_error";
  return e;
}

ApiError ApiErrorFromStatus(const Status& status) {
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
      return MakeApiError(400, status.message());
    case StatusCode::kResourceExhausted:
      return MakeApiError(429, status.message());
    case StatusCode::kUnavailable:
      return MakeApiError(503, status.message());
    default:
      return MakeApiError(500, status.message());
  }
}

namespace {

ParsedCompletion ParseRequest(std::string_view body, const CompletionContext& context, bool chat) {
  ParsedCompletion out;
  out.request.chat = chat;
  if (JsonNestingDepth(body) > kMaxJsonDepth) {
    out.error = MakeApiError(
        400, "the request body nests deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    return out;
  }
  Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    out.error = MakeApiError(400, "the request body is not valid JSON");
  } else if (!j.is_object()) {
    out.error = MakeApiError(400, "the request body must be a JSON object");
  } else {
    try {
      out.error = ParseFields(j, context, &out.request);
    } catch (const nlohmann::json::exception& e) {
      out.error = MakeApiError(400, std::string("malformed request: ") + e.what());
    }
  }
  return out;
}

}  // namespace

ParsedCompletion ParseCompletionRequest(std::string_view body, const CompletionContext& context) {
  return ParseRequest(body, context, /*chat=*/false);
}

ParsedCompletion ParseChatCompletionRequest(std::string_view body,
                                            const CompletionContext& context) {
  return ParseRequest(body, context, /*chat=*/true);
}

namespace {

OrderedJson ChoiceJson(std::string_view text, std::string_view finish_reason,
                       const std::vector<int32_t>& token_ids,
                       const std::vector<int32_t>* prompt_ids) {
  OrderedJson c;
  c["index"] = 0;
  c["text"] = std::string(text);
  c["logprobs"] = nullptr;
  c["finish_reason"] = FinishReasonJson(finish_reason);
  c["token_ids"] = token_ids;
  if (prompt_ids != nullptr) c["prompt_token_ids"] = *prompt_ids;
  return c;
}

}  // namespace

std::string CompletionBody(const CompletionHeader& header, std::string_view text,
                           std::string_view finish_reason, const std::vector<int32_t>& token_ids,
                           const std::vector<int32_t>& prompt_ids, const CompletionUsage& usage) {
  OrderedJson j = ResponseHeaderJson(header, "text_completion");
  j["choices"] = OrderedJson::array({ChoiceJson(text, finish_reason, token_ids, &prompt_ids)});
  j["usage"] = ResponseUsageJson(usage);
  return DumpJson(j);
}

std::string CompletionChunk(const CompletionHeader& header, std::string_view text,
                            std::string_view finish_reason, const std::vector<int32_t>& token_ids,
                            const std::vector<int32_t>* prompt_ids) {
  OrderedJson j = ResponseHeaderJson(header, "text_completion");
  j["choices"] = OrderedJson::array({ChoiceJson(text, finish_reason, token_ids, prompt_ids)});
  return DumpJson(j);
}

std::string UsageChunk(const CompletionHeader& header, const CompletionUsage& usage) {
  OrderedJson j = ResponseHeaderJson(header, "text_completion");
  j["choices"] = OrderedJson::array();
  j["usage"] = ResponseUsageJson(usage);
  return DumpJson(j);
}

std::string SseEvent(std::string_view json) {
  std::string out = "data: ";
  out.append(json);
  out += "\n\n";
  return out;
}

std::string SseDone() { return "data: [DONE]\n\n"; }

}  // namespace baton
