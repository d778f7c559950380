// The engine SDK's reading of what baton-controller puts in an engine's environment: the
// launch fields (BATON_SOCKET, BATON_LAUNCH_TOKEN, BATON_ENGINE_ID, BATON_ROLE,
// BATON_HTTP_PORT) and the controller-absence policy (engine_sdk.h).
#include <cerrno>
#include <cstdlib>
#include <string>

#include "standby/sdk/engine_sdk.h"

namespace baton {
namespace {

Result<std::string> RequiredEnv(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') {
    return InvalidArgument(std::string("environment variable ") + name +
                           " is not set (is this engine started by baton-controller?)");
  }
  return std::string(value);
}

Result<uint64_t> ParseUnsigned(const std::string& text, const char* what) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  if (text.empty() || end == nullptr || *end != '\0' || errno != 0 || text[0] == '-') {
    return InvalidArgument(std::string(what) + " is not an unsigned number: '" + text + "'");
  }
  return static_cast<uint64_t>(v);
}

}  // namespace

Status ControllerAbsenceFromEnv(EngineSessionOptions* options) {
  constexpr const char* kTimeout = "BATON_CONTROLLER_ABSENT_TIMEOUT_MS";
  constexpr const char* kAction = "BATON_ON_CONTROLLER_ABSENT";
  Duration timeout = options->controller_absent_timeout;
  ControllerAbsentAction action = options->on_controller_absent;
  if (const char* text = std::getenv(kTimeout); text != nullptr && *text != '\0') {
    BATON_ASSIGN_OR_RETURN(uint64_t ms, ParseUnsigned(text, kTimeout));
    if (ms > uint64_t{365} * 24 * 3600 * 1000) {
      return InvalidArgument(std::string(kTimeout) + " " + text + " is more than a year");
    }
    timeout = std::chrono::milliseconds(ms);
  }
  if (const char* text = std::getenv(kAction); text != nullptr && *text != '\0') {
    const std::string_view value = text;
    if (value == "serve") {
      action = ControllerAbsentAction::kServe;
    } else if (value == "stop") {
      action = ControllerAbsentAction::kStop;
    } else {
      return InvalidArgument(std::string(kAction) + " is '" + text + "'; expected serve or stop");
    }
  }
  options->controller_absent_timeout = timeout;
  options->on_controller_absent = action;
  return OkStatus();
}

Status FillLaunchInfoFromEnv(EngineLaunchInfo* info) {
  if (info->socket_path.empty()) {
    BATON_ASSIGN_OR_RETURN(info->socket_path, RequiredEnv("BATON_SOCKET"));
  }
  if (info->launch_token.empty()) {
    BATON_ASSIGN_OR_RETURN(info->launch_token, RequiredEnv("BATON_LAUNCH_TOKEN"));
  }
  if (info->engine_id == 0) {
    BATON_ASSIGN_OR_RETURN(std::string id_text, RequiredEnv("BATON_ENGINE_ID"));
    BATON_ASSIGN_OR_RETURN(info->engine_id, ParseUnsigned(id_text, "BATON_ENGINE_ID"));
  }
  return OkStatus();
}

Result<EngineLaunchInfo> LaunchInfoFromEnv() {
  EngineLaunchInfo info;
  BATON_RETURN_IF_ERROR(FillLaunchInfoFromEnv(&info));
  if (const char* role = std::getenv("BATON_ROLE"); role != nullptr) info.role = role;
  if (const char* port = std::getenv("BATON_HTTP_PORT"); port != nullptr && *port != '\0') {
    BATON_ASSIGN_OR_RETURN(uint64_t p, ParseUnsigned(port, "BATON_HTTP_PORT"));
    if (p > 65535)
      return InvalidArgument("BATON_HTTP_PORT " + std::string(port) + " is not a port");
    info.http_port = static_cast<int>(p);
  }
  return info;
}

}  // namespace baton
