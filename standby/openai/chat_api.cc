#include "standby/openai/chat_api.h"

#include <nlohmann/json.hpp>

#include "standby/openai/completion_json.h"

namespace baton {
namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

bool KnownRole(const std::string& role) {
  for (const char* r : {"system", "developer", "user", "assistant", "tool"}) {
    if (role == r) return true;
  }
  return false;
}

// The text of one message's `content`, or an error naming what is not text.
Result<std::string> ContentText(const Json& content, const std::string& where) {
  if (content.is_null()) return std::string();
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) {
    return InvalidArgument(where + ".content must be a string or an array of text parts");
  }
  std::string text;
  for (const Json& part : content) {
    const auto type = part.is_object() ? part.find("type") : part.end();
    const auto value = part.is_object() ? part.find("text") : part.end();
    if (type == part.end() || *type != "text" || value == part.end() || !value->is_string()) {
      return InvalidArgument(where + ": only text parts ({\"type\": \"text\", \"text\": ...}) " +
                             "are supported");
    }
    text += value->get<std::string>();
  }
  return text;
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

Result<std::string> RenderChatPrompt(const Json& messages) {
  if (!messages.is_array() || messages.empty()) {
    return InvalidArgument("'messages' must be a non-empty array of messages");
  }
  std::string prompt;
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string where = "messages[" + std::to_string(i) + "]";
    const Json& m = messages[i];
    const auto role = m.is_object() ? m.find("role") : m.end();
    if (role == m.end() || !role->is_string() || !KnownRole(role->get<std::string>())) {
      return InvalidArgument(where + ".role must be one of system, developer, user, " +
                             "assistant, tool");
    }
    const auto content = m.find("content");
    Result<std::string> text = ContentText(content == m.end() ? Json() : *content, where);
    if (!text.ok()) return text.status();
    prompt += "<|" + role->get<std::string>() + "|>\n" + *text + "\n";
  }
  return prompt + "<|assistant|>\n";
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
