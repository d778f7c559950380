#include "standby/openai/chat_api.h"

#include <nlohmann/json.hpp>

#include "standby/openai/completion_json.h"

namespace baton {
namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

ApiError Invalid(const std::string& param, std::string message) {
  return MakeApiError(400, std::move(message), param);
}

ApiError Missing(const std::string& param) {
  ApiError e = MakeApiError(400, "Missing required parameter: '" + param + "'.", param);
  e.code = "missing_required_parameter";
  return e;
}

bool KnownRole(const std::string& role) {
  for (const char* r : {"system", "developer", "user", "assistant", "tool"}) {
    if (role == r) return true;
  }
  return false;
}

// The text of one message's `content` (at `where`, present and not null), or what is wrong.
std::optional<ApiError> ContentText(const Json& content, const std::string& where,
                                    std::string* text) {
  if (content.is_string()) {
    *text = content.get<std::string>();
    return std::nullopt;
  }
  if (!content.is_array()) {
    return Invalid(where, "'" + where + "' must be a string or an array of text parts");
  }
  if (content.empty()) {
    return Invalid(where, "'" + where + "' is an empty array: give at least one text part");
  }
  for (size_t j = 0; j < content.size(); ++j) {
    const Json& part = content[j];
    const std::string at = where + "[" + std::to_string(j) + "]";
    if (!part.is_object()) return Invalid(at, "'" + at + "' must be an object");
    const auto type = part.find("type");
    if (type == part.end()) return Missing(at + ".type");
    if (*type != "text") {
      return Invalid(at + ".type", "'" + at + ".type' " + type->dump() +
                                       " is not supported: only text parts "
                                       "({\"type\": \"text\", \"text\": ...})");
    }
    const auto value = part.find("text");
    if (value == part.end()) return Missing(at + ".text");
    if (!value->is_string()) return Invalid(at + ".text", "'" + at + ".text' must be a string");
    *text += value->get<std::string>();
  }
  return std::nullopt;
}

// One message, as OpenAI checks it: an object with a known `role`; `content` required (an
// assistant's may be left out only beside tool calls, which this template cannot render);
// a tool's `tool_call_id` and any `name` strings.
std::optional<ApiError> MessageText(const Json& m, const std::string& where, std::string* role,
                                    std::string* text) {
  if (!m.is_object()) return Invalid(where, "'" + where + "' must be an object");
  const auto r = m.find("role");
  if (r == m.end() || r->is_null()) return Missing(where + ".role");
  if (!r->is_string() || !KnownRole(r->get<std::string>())) {
    return Invalid(where + ".role", "Invalid value for '" + where + ".role': " + r->dump() +
                                        ". Supported values are: 'system', 'developer', "
                                        "'user', 'assistant' and 'tool'.");
  }
  *role = r->get<std::string>();
  for (const char* key : {"tool_calls", "function_call"}) {
    const auto calls = m.find(key);
    if (calls != m.end() && !calls->is_null()) {
      return Invalid(where + "." + key,
                     "'" + where + "." + key + "' is not supported: this model has no tool calls");
    }
  }
  const auto name = m.find("name");
  if (name != m.end() && !name->is_string()) {
    return Invalid(where + ".name", "'" + where + ".name' must be a string");
  }
  if (*role == "tool") {
    const auto id = m.find("tool_call_id");
    if (id == m.end() || id->is_null()) return Missing(where + ".tool_call_id");
    if (!id->is_string()) {
      return Invalid(where + ".tool_call_id", "'" + where + ".tool_call_id' must be a string");
    }
  }
  const auto content = m.find("content");
  if (content == m.end() || content->is_null()) return Missing(where + ".content");
  return ContentText(*content, where + ".content", text);
}

// One choice of a chat answer: `part` ("message" or "delta") holds `body`.
OrderedJson ChatChoice(const char* part, OrderedJson body, std::string_view finish_reason,
                       const std::vector<int32_t>& token_ids) {
  OrderedJson c;
  c["index"] = 0;
  c[part] = std::move(body);
  c["logprobs"] = nullptr;
  c["finish_reason"] = FinishReasonJson(finish_reason);
  c["token_ids"] = token_ids;
  return c;
}

}  // namespace

std::optional<ApiError> RenderChatPrompt(const Json& messages, std::string* prompt) {
  if (!messages.is_array() || messages.empty()) {
    return Invalid("messages", "'messages' must be a non-empty array of messages");
  }
  prompt->clear();
  for (size_t i = 0; i < messages.size(); ++i) {
    std::string role, text;
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (auto e = MessageText(messages[i], where, &role, &text)) return e;
    *prompt += "<|" + role + "|>\n" + text + "\n";
  }
  *prompt += "<|assistant|>\n";
  return std::nullopt;
}

Result<std::string> RenderChatPrompt(const Json& messages) {
  std::string prompt;
  if (auto e = RenderChatPrompt(messages, &prompt)) return InvalidArgument(e->message);
  return prompt;
}

std::string ChatBody(const CompletionHeader& header, std::string_view text,
                     std::string_view finish_reason, const std::vector<int32_t>& token_ids,
                     const std::vector<int32_t>& prompt_ids, const CompletionUsage& usage) {
  OrderedJson message;
  message["role"] = "assistant";
  message["content"] = std::string(text);
  OrderedJson j = ResponseHeaderJson(header, "chat.completion");
  j["choices"] =
      OrderedJson::array({ChatChoice("message", std::move(message), finish_reason, token_ids)});
  j["usage"] = ResponseUsageJson(usage);
  j["prompt_token_ids"] = prompt_ids;
  return DumpJson(j);
}

std::string ChatChunk(const CompletionHeader& header, std::string_view text,
                      std::string_view finish_reason, const std::vector<int32_t>& token_ids,
                      const std::vector<int32_t>* prompt_ids) {
  OrderedJson delta;
  if (prompt_ids != nullptr) delta["role"] = "assistant";
  delta["content"] = std::string(text);
  OrderedJson j = ResponseHeaderJson(header, "chat.completion.chunk");
  j["choices"] =
      OrderedJson::array({ChatChoice("delta", std::move(delta), finish_reason, token_ids)});
  if (prompt_ids != nullptr) j["prompt_token_ids"] = *prompt_ids;
  return DumpJson(j);
}

std::string ChatUsageChunk(const CompletionHeader& header, const CompletionUsage& usage) {
  OrderedJson j = ResponseHeaderJson(header, "chat.completion.chunk");
  j["choices"] = OrderedJson::array();
  j["usage"] = ResponseUsageJson(usage);
  return DumpJson(j);
}

}  // namespace baton
