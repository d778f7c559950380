#include "standby/openai/completion_json.h"

namespace baton {

nlohmann::ordered_json ResponseHeaderJson(const CompletionHeader& header, const char* object) {
  nlohmann::ordered_json j;
  j["id"] = header.id;
  j["object"] = object;
  j["created"] = header.created;
  j["model"] = header.model;
  j["seed"] = header.seed;
  return j;
}

nlohmann::ordered_json ResponseUsageJson(const CompletionUsage& usage) {
  nlohmann::ordered_json j;
  j["prompt_tokens"] = usage.prompt_tokens;
  j["completion_tokens"] = usage.completion_tokens;
  j["total_tokens"] = usage.prompt_tokens + usage.completion_tokens;
  return j;
}

nlohmann::ordered_json FinishReasonJson(std::string_view finish_reason) {
  if (finish_reason.empty()) return nlohmann::ordered_json(nullptr);
  return nlohmann::ordered_json(std::string(finish_reason));
}

std::string DumpJson(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace baton
