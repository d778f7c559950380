// The JSON pieces that the completions and the chat completions responses share
// (completions_api.h, chat_api.h): the header fields, usage, a finish reason, and printing
// that never throws on invalid UTF-8. Internal to the reference engine's API; plain functions.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "standby/openai/completions_api.h"

namespace baton {

// `id`, `object`, `created`, `model`, `seed`, in that order.
nlohmann::ordered_json ResponseHeaderJson(const CompletionHeader& header, const char* object);
// `prompt_tokens`, `completion_tokens`, `total_tokens`.
nlohmann::ordered_json ResponseUsageJson(const CompletionUsage& usage);
// The reason, or null when empty (the generation goes on).
nlohmann::ordered_json FinishReasonJson(std::string_view finish_reason);
// Compact text; invalid UTF-8 becomes U+FFFD.
std::string DumpJson(const nlohmann::ordered_json& j);

}  // namespace baton
