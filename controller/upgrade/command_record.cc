#include "controller/upgrade/command_record.h"

#include <unistd.h>

#include <cerrno>
#include <nlohmann/json.hpp>

#include "base/io/small_file.h"
#include "base/text/json_depth.h"
#include "base/text/utf8.h"

namespace baton {
namespace {

using nlohmann::json;
constexpr size_t kMaxBytes = 1 << 20;

Result<std::vector<std::string>> Strings(const json& j, const char* key, const std::string& path) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_array()) {
    return InvalidArgument(path + ": '" + key + "' is not an array of strings");
  }
  std::vector<std::string> out;
  for (const json& s : *it) {
    if (!s.is_string()) return InvalidArgument(path + ": '" + key + "' holds a non-string");
    out.push_back(s.get<std::string>());
  }
  return out;
}

Result<std::optional<InFlightUpgrade>> InFlight(const json& j, const std::string& path) {
  auto it = j.find("in_flight");
  if (it == j.end() || it->is_null()) return std::optional<InFlightUpgrade>();
  const json& u = *it;
  if (!u.is_object() || !u.value("kind", json()).is_string() ||
      !u.value("phase", json()).is_string() || !u.value("canary", json()).is_number_unsigned() ||
      !u.value("weight", json()).is_number_unsigned()) {
    return InvalidArgument(path + ": 'in_flight' needs kind, phase, canary and weight");
  }
  Result<UpgradeKind> kind = ParseUpgradeKind(u["kind"].get<std::string>());
  if (!kind.ok()) return InvalidArgument(path + ": 'in_flight': " + kind.status().message());
  Result<UpgradePhase> phase = ParseUpgradePhase(u["phase"].get<std::string>());
  if (!phase.ok()) return InvalidArgument(path + ": 'in_flight': " + phase.status().message());
  InFlightUpgrade out{.kind = *kind,
                      .command = {},
                      .phase = *phase,
                      .canary = u["canary"].get<uint64_t>(),
                      .weight = u["weight"].get<uint32_t>()};
  BATON_ASSIGN_OR_RETURN(out.command, Strings(u, "command", path));
  // Added later: absent in an older controller's record.
  if (u.contains("primary") && u["primary"].is_number_unsigned()) {
    out.primary = u["primary"].get<uint64_t>();
  }
  if (u.contains("steps") && u["steps"].is_array()) {
    for (const json& step : u["steps"]) {
      if (!step.is_number_unsigned() || step.get<uint64_t>() > 100) {
        return InvalidArgument(path + ": 'in_flight.steps' holds a value that is not 0..100");
      }
      out.steps.push_back(step.get<uint32_t>());
    }
  }
  if (u.contains("step_duration_ms") && u["step_duration_ms"].is_number_unsigned()) {
    out.step_duration_ms = u["step_duration_ms"].get<uint64_t>();
  }
  if (u.contains("min_requests") && u["min_requests"].is_number_unsigned()) {
    out.min_requests = u["min_requests"].get<uint64_t>();
  }
  return std::optional<InFlightUpgrade>(std::move(out));
}

}  // namespace

Status CheckRecordableCommand(const std::vector<std::string>& command, const std::string& what) {
  for (size_t i = 0; i < command.size(); ++i) {
    if (std::optional<size_t> bad = FirstInvalidUtf8(command[i])) {
      return InvalidArgument(what + ": word " + std::to_string(i + 1) +
                             " is not valid UTF-8 (byte " + std::to_string(*bad + 1) + ")");
    }
  }
  return OkStatus();
}

Status SaveCommandRecord(const std::string& path, const CommandRecord& record) {
  BATON_RETURN_IF_ERROR(CheckRecordableCommand(record.configured, "engine.command"));
  BATON_RETURN_IF_ERROR(CheckRecordableCommand(record.active, "the active engine command"));
  BATON_RETURN_IF_ERROR(CheckRecordableCommand(record.previous, "the previous engine command"));
  if (record.in_flight.has_value()) {
    BATON_RETURN_IF_ERROR(
        CheckRecordableCommand(record.in_flight->command, "the upgrade's engine command"));
  }
  json j = {
      {"configured", record.configured}, {"active", record.active}, {"previous", record.previous}};
  if (const std::optional<InFlightUpgrade>& u = record.in_flight; u.has_value()) {
    j["in_flight"] = {{"kind", ToString(u->kind)},
                      {"command", u->command},
                      {"phase", ToString(u->phase)},
                      {"canary", u->canary},
                      {"weight", u->weight},
                      {"primary", u->primary},
                      {"steps", u->steps},
                      {"step_duration_ms", u->step_duration_ms},
                      {"min_requests", u->min_requests}};
  }
  // Strict printing cannot throw now; the other strings (kind, phase) are the controller's.
  return WriteFileAtomically(path, j.dump(2, ' ', false, json::error_handler_t::replace) + "\n");
}

Result<std::optional<CommandRecord>> LoadCommandRecord(const std::string& path) {
  if (::access(path.c_str(), F_OK) != 0 && errno == ENOENT) return std::optional<CommandRecord>();
  BATON_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(path, kMaxBytes));
  const std::string* bytes = &text;
  if (bytes->size() > kMaxBytes) return InvalidArgument(path + ": larger than 1 MiB");
  if (JsonNestingDepth(*bytes) > kMaxJsonDepth) return InvalidArgument(path + ": nested too deep");
  const json j = json::parse(*bytes, nullptr, false);
  if (!j.is_object()) return InvalidArgument(path + ": not a JSON object");
  CommandRecord r;
  BATON_ASSIGN_OR_RETURN(r.configured, Strings(j, "configured", path));
  BATON_ASSIGN_OR_RETURN(r.active, Strings(j, "active", path));
  BATON_ASSIGN_OR_RETURN(r.previous, Strings(j, "previous", path));
  if (r.active.empty()) return InvalidArgument(path + ": 'active' is empty");
  Result<std::optional<InFlightUpgrade>> in_flight = InFlight(j, path);
  if (in_flight.ok()) {
    r.in_flight = std::move(in_flight).value();
  } else {
    r.ignored = in_flight.status().message();
  }
  return std::optional<CommandRecord>(std::move(r));
}

}  // namespace baton
