#include "router/upstream/error_bodies.h"

#include <nlohmann/json.hpp>
#include <utility>

#include "base/text/json_depth.h"

namespace baton {
namespace {

std::string ErrorJson(const std::string& message, const char* type, const char* param,
                      const char* code) {
  nlohmann::ordered_json inner;
  inner["message"] = message;
  inner["type"] = type;
  inner["param"] = param != nullptr ? nlohmann::ordered_json(param) : nullptr;
  inner["code"] = code;
  nlohmann::ordered_json j;
  j["error"] = std::move(inner);
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

std::string ModelNotFoundJson(const std::string& message) {
  return ErrorJson(message, "not_found_error", "model", "model_not_found");
}

std::string OutOfServiceJson(const std::string& message) {
  return ErrorJson(message, "server_error", nullptr, "out_of_service");
}

std::string ErrorMessage(const std::string& body) {
  nlohmann::json j = JsonNestingDepth(body) > kMaxJsonDepth
                         ? nlohmann::json(nlohmann::json::value_t::discarded)
                         : nlohmann::json::parse(body, nullptr, false);
  if (j.is_object() && j.contains("error") && j["error"].is_object()) {
    auto message = j["error"].find("message");
    if (message != j["error"].end() && message->is_string() && !message->empty()) {
      return message->get<std::string>();
    }
  }
  return body.substr(0, 200);  // printed with invalid UTF-8 replaced
}

}  // namespace baton
