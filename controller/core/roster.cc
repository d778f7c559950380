#include "controller/core/roster.h"

#include <nlohmann/json.hpp>

#include "base/text/json_field.h"

namespace baton {
namespace {

using nlohmann::json;

constexpr const char* kRoles[] = {"launching", "standby",  "promoting",
                                  "serving",   "draining", "fencing"};

json ExtentsJson(const std::vector<Extent>& extents) {
  json out = json::array();
  for (const Extent& e : extents) out.push_back({e.first, e.count});
  return out;
}

json EngineJson(const RosterEngine& e) {
  return {{"id", e.id},
          {"pid", e.pid},
          {"start_time", e.start_time},
          {"token", e.token},
          {"launch_role", proto::ToString(e.launch_role)},
          {"port", e.port},
          {"command", e.command},
          {"cgroup", e.cgroup},
          {"role", ToString(e.role)},
          {"epoch", e.epoch},
          {"extents", ExtentsJson(e.extents)},
          {"version", e.version},
          {"http_address", e.http_address},
          {"device_memory", e.device_memory}};
}

// Reads field `key` of `j` as a T; names `where` and the key when it is missing or mistyped.

Result<std::vector<Extent>> ExtentsFrom(const json& j, const std::string& where) {
  if (!j.is_array()) return InvalidArgument(where + ": 'extents' is not an array");
  std::vector<Extent> out;
  for (const json& pair : j) {
    if (!pair.is_array() || pair.size() != 2 || !pair[0].is_number_unsigned() ||
        !pair[1].is_number_unsigned()) {
      return InvalidArgument(where + ": an extent is not [first, count]");
    }
    const uint64_t first = pair[0].get<uint64_t>();
    const uint64_t count = pair[1].get<uint64_t>();
    if (count == 0 || first + count > UINT32_MAX) {
      return InvalidArgument(where + ": extent [" + std::to_string(first) + ", " +
                             std::to_string(count) + "] is empty or out of range");
    }
    out.push_back(Extent{static_cast<uint32_t>(first), static_cast<uint32_t>(count)});
  }
  return out;
}

Result<RosterEngine> EngineFrom(const json& j, const std::string& where) {
  if (!j.is_object()) return InvalidArgument(where + " is not an object");
  RosterEngine e;
  std::string role;
  std::string launch_role;
  BATON_RETURN_IF_ERROR(JsonField(j, "id", where, &e.id));
  BATON_RETURN_IF_ERROR(JsonField(j, "pid", where, &e.pid));
  BATON_RETURN_IF_ERROR(JsonField(j, "start_time", where, &e.start_time));
  BATON_RETURN_IF_ERROR(JsonField(j, "token", where, &e.token));
  BATON_RETURN_IF_ERROR(JsonField(j, "launch_role", where, &launch_role));
  Result<proto::LaunchRole> launched = proto::ParseLaunchRole(launch_role);
  if (!launched.ok()) return InvalidArgument(where + ": " + launched.status().message());
  e.launch_role = *launched;
  BATON_RETURN_IF_ERROR(JsonField(j, "port", where, &e.port));
  BATON_RETURN_IF_ERROR(JsonField(j, "command", where, &e.command));
  BATON_RETURN_IF_ERROR(JsonField(j, "cgroup", where, &e.cgroup));
  BATON_RETURN_IF_ERROR(JsonField(j, "role", where, &role));
  BATON_RETURN_IF_ERROR(JsonField(j, "epoch", where, &e.epoch));
  BATON_RETURN_IF_ERROR(JsonField(j, "version", where, &e.version));
  BATON_RETURN_IF_ERROR(JsonField(j, "http_address", where, &e.http_address));
  if (j.contains("device_memory")) {
    BATON_RETURN_IF_ERROR(JsonField(j, "device_memory", where, &e.device_memory));
  }
  Result<RosterRole> parsed = ParseRosterRole(role);
  if (!parsed.ok()) return InvalidArgument(where + ": " + parsed.status().message());
  e.role = *parsed;
  if (e.id == kNoEngine) return InvalidArgument(where + ": engine id 0");
  if (!j.contains("extents")) return InvalidArgument(where + ": 'extents' is missing");
  BATON_ASSIGN_OR_RETURN(e.extents, ExtentsFrom(j["extents"], where));
  return e;
}

}  // namespace

const char* ToString(RosterRole role) { return kRoles[static_cast<int>(role)]; }

Result<RosterRole> ParseRosterRole(const std::string& text) {
  for (int i = 0; i < static_cast<int>(std::size(kRoles)); ++i) {
    if (text == kRoles[i]) return static_cast<RosterRole>(i);
  }
  return InvalidArgument("unknown roster role '" + text + "'");
}

const RosterEngine* Roster::Find(EngineId id) const {
  for (const RosterEngine& e : engines) {
    if (e.id == id) return &e;
  }
  return nullptr;
}

std::string EncodeRoster(const Roster& roster) {
  json engines = json::array();
  for (const RosterEngine& e : roster.engines) engines.push_back(EngineJson(e));
  json j = {{"format", Roster::kFormat},         {"boot_id", roster.boot_id},
            {"incarnation", roster.incarnation}, {"next_engine_id", roster.next_engine_id},
            {"primary", roster.primary},         {"pair_draining", roster.pair_draining},
            {"engines", std::move(engines)},     {"sequence", roster.sequence},
            {"checksum", roster.checksum}};
  return j.dump(1) + "\n";
}

Result<Roster> DecodeRoster(const std::string& text, const std::string& where) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return InvalidArgument(where + ": not a JSON object");
  int format = 0;
  BATON_RETURN_IF_ERROR(JsonField(j, "format", where, &format));
  if (format != Roster::kFormat) {
    return InvalidArgument(where + ": format " + std::to_string(format) + ", this build reads " +
                           std::to_string(Roster::kFormat));
  }
  Roster r;
  BATON_RETURN_IF_ERROR(JsonField(j, "boot_id", where, &r.boot_id));
  BATON_RETURN_IF_ERROR(JsonField(j, "incarnation", where, &r.incarnation));
  BATON_RETURN_IF_ERROR(JsonField(j, "next_engine_id", where, &r.next_engine_id));
  BATON_RETURN_IF_ERROR(JsonField(j, "primary", where, &r.primary));
  BATON_RETURN_IF_ERROR(JsonField(j, "pair_draining", where, &r.pair_draining));
  if (j.contains("sequence")) BATON_RETURN_IF_ERROR(JsonField(j, "sequence", where, &r.sequence));
  if (j.contains("checksum")) BATON_RETURN_IF_ERROR(JsonField(j, "checksum", where, &r.checksum));
  if (!j.contains("engines") || !j["engines"].is_array()) {
    return InvalidArgument(where + ": 'engines' is not an array");
  }
  for (const json& e : j["engines"]) {
    const std::string at = where + ": engine " + std::to_string(r.engines.size());
    BATON_ASSIGN_OR_RETURN(RosterEngine engine, EngineFrom(e, at));
    if (r.Find(engine.id) != nullptr || engine.id >= r.next_engine_id) {
      return InvalidArgument(at + ": id " + std::to_string(engine.id) +
                             " is listed twice or not below next_engine_id");
    }
    r.engines.push_back(std::move(engine));
  }
  return r;
}

}  // namespace baton
