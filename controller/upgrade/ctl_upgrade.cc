#include "controller/upgrade/ctl_upgrade.h"

#include <charconv>
#include <sstream>

#include "controller/engines/engine_placeholders.h"
#include "controller/upgrade/command_record.h"

namespace baton {
namespace {

using nlohmann::json;

json CommandJson(const std::vector<std::string>& command) {
  json out = json::array();
  for (const std::string& a : command) out.push_back(a);
  return out;
}

json SeenJson(const proto::EngineOutcome& o) {
  return {{"requests", o.requests},
          {"errors", o.errors},
          {"compared", o.compared},
          {"disagreed", o.disagreed},
          {"mean_ms", o.succeeded == 0 ? 0.0 : static_cast<double>(o.duration_ms) / o.succeeded}};
}

json ResultJson(const ControllerStatus& c, const UpgradeResult& r) {
  return {{"kind", ToString(r.kind)},
          {"outcome", ToString(r.outcome)},
          {"reason", r.reason},
          {"canary", r.canary},
          {"version", r.version},
          {"last_weight", r.last_weight},
          {"duration_ms", MillisBetween(r.started, r.ended)},
          {"ended_ago_ms", MillisBetween(r.ended, c.core.now)}};
}

// `command` ("upgrade" or "rollback") names the command in the errors.
Result<UpgradeRequest> ParseOptions(const std::vector<std::string>& args,
                                    const std::string& command);

Result<uint64_t> ParseCount(const std::string& flag, const std::string& text) {
  uint64_t v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size()) {
    return InvalidArgument(flag + ": not a number: '" + text + "'");
  }
  return v;
}

}  // namespace

Result<UpgradeRequest> ParseRollbackArgs(const std::vector<std::string>& args) {
  for (const std::string& a : args) {
    if (a == "--" || a == "--engine-cmd") {
      return InvalidArgument("rollback takes no engine command: it returns to the previous one");
    }
  }
  return ParseOptions(args, "rollback");
}

Status CheckRollbackOptions(const UpgradeRequest& request, bool upgrade_running) {
  const bool options = request.steps.has_value() || request.step_duration.has_value() ||
                       request.min_requests.has_value();
  if (!upgrade_running || !options) return OkStatus();
  return FailedPrecondition(
      "--steps, --step-ms and --min-requests shape the canary of a rollback to the previous "
      "command, started when no upgrade runs; the running upgrade's canary is rolled back at "
      "once (drained, or stopped): run `batonctl rollback` without them");
}

Result<UpgradeRequest> ParseUpgradeArgs(const std::vector<std::string>& args) {
  BATON_ASSIGN_OR_RETURN(UpgradeRequest r, ParseOptions(args, "upgrade"));
  if (r.command.empty()) {
    return InvalidArgument("upgrade needs the new engine command: -- CMD ARGS... or --engine-cmd");
  }
  BATON_RETURN_IF_ERROR(CheckRecordableCommand(r.command, "the engine command"));
  BATON_RETURN_IF_ERROR(CheckPlaceholders(r.command, "the engine command"));
  return r;
}

namespace {

constexpr uint64_t kMaxStepMs = 86'400'000;  // as upgrade.step_duration_ms allows

Result<UpgradeRequest> ParseOptions(const std::vector<std::string>& args,
                                    const std::string& command) {
  UpgradeRequest r;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") {
      if (!r.command.empty())
        return InvalidArgument("give the engine command once: -- or --engine-cmd");
      r.command.assign(args.begin() + static_cast<std::ptrdiff_t>(i) + 1, args.end());
      break;
    }
    if (a.rfind("--", 0) != 0) {  // not an option: a word of an engine command given without --
      return InvalidArgument(
          "unexpected argument '" + a + "'" +
          (command == "upgrade"
               ? ": the engine command comes after --, as in: batonctl upgrade -- " + a + " ..."
               : ": rollback takes only --steps, --step-ms and --min-requests"));
    }
    if (a != "--engine-cmd" && a != "--steps" && a != "--step-ms" && a != "--min-requests") {
      return InvalidArgument("unknown option '" + a + "' for " + command);
    }
    if (i + 1 >= args.size()) return InvalidArgument(a + " needs a value");
    const std::string& v = args[++i];
    if (a == "--engine-cmd") {
      if (!r.command.empty())
        return InvalidArgument("give the engine command once: -- or --engine-cmd");
      BATON_ASSIGN_OR_RETURN(r.command, SplitCommandLine(v));
    } else if (a == "--steps") {
      BATON_ASSIGN_OR_RETURN(r.steps, ParseCanarySteps(v));
    } else if (a == "--step-ms") {
      BATON_ASSIGN_OR_RETURN(uint64_t ms, ParseCount(a, v));
      if (ms > kMaxStepMs) {
        return InvalidArgument("--step-ms: at most " + std::to_string(kMaxStepMs) + " (a day)");
      }
      r.step_duration = std::chrono::milliseconds(ms);
    } else if (a == "--min-requests") {
      BATON_ASSIGN_OR_RETURN(uint64_t n, ParseCount(a, v));
      if (n == 0) return InvalidArgument("--min-requests: must be at least 1");
      r.min_requests = n;
    }
  }
  return r;
}

}  // namespace

json UpgradeJson(const ControllerStatus& s) {
  const CoordinatorStatus& c = s.core;
  json history = json::array();
  for (const UpgradeResult& r : c.upgrade_history) history.push_back(ResultJson(s, r));
  json current = nullptr;
  if (const std::optional<UpgradeStatus>& u = c.upgrade; u.has_value()) {
    current = {{"kind", ToString(u->kind)},
               {"phase", ToString(u->phase)},
               {"primary", u->primary},
               {"canary", u->canary},
               {"command", CommandJson(u->command)},
               {"steps", u->steps},
               {"step", u->step.value_or(0)},
               {"weight", u->weight},
               {"judgement", u->judgement},
               {"rollback_reason", u->rollback_reason},
               {"phase_ms", MillisBetween(u->phase_since, c.now)},
               {"elapsed_ms", MillisBetween(u->started, c.now)}};
    if (u->canary_seen.has_value()) current["canary_seen"] = SeenJson(*u->canary_seen);
    if (u->primary_seen.has_value()) current["primary_seen"] = SeenJson(*u->primary_seen);
  }
  return {{"current", current},
          {"history", history},
          {"active_command", CommandJson(c.active_command)},
          {"previous_command", CommandJson(c.previous_command)},
          {"promoted", c.upgrades_promoted},
          {"rolled_back", c.upgrades_rolled_back}};
}

std::string UpgradeText(const ControllerStatus& s) {
  const CoordinatorStatus& c = s.core;
  std::ostringstream out;
  if (const std::optional<UpgradeStatus>& u = c.upgrade; u.has_value()) {
    out << ToString(u->kind) << " in progress: phase " << ToString(u->phase) << ", canary engine "
        << u->canary;
    if (u->step.has_value()) out << " at " << u->weight << " %";
    if (!u->judgement.empty()) out << " (" << u->judgement << ")";
    out << "\n";
  }
  if (!c.upgrade_history.empty()) {
    const UpgradeResult& r = c.upgrade_history.back();
    out << "last " << ToString(r.kind) << ": " << ToString(r.outcome) << " (";
    if (r.canary != kNoEngine) out << "engine " << r.canary << ", ";
    out << r.reason << ")\n";
  }
  return out.str();
}

std::string UpgradeMetrics(const ControllerStatus& s) {
  const CoordinatorStatus& c = s.core;
  std::ostringstream out;
  out << "# HELP baton_upgrades_total Canary upgrades and rollbacks that ended, by outcome\n"
      << "# TYPE baton_upgrades_total counter\n"
      << "baton_upgrades_total{outcome=\"promoted\"} " << c.upgrades_promoted << "\n"
      << "baton_upgrades_total{outcome=\"rolled_back\"} " << c.upgrades_rolled_back << "\n";
  const std::optional<UpgradeStatus>& u = c.upgrade;
  out << "# HELP baton_canary_weight_percent Share of new requests the canary gets (0: none)\n"
      << "# TYPE baton_canary_weight_percent gauge\n"
      << "baton_canary_weight_percent "
      << (u.has_value() && u->step.has_value() && u->phase == Upgrade::Phase::kCanary ? u->weight
                                                                                      : 0)
      << "\n";
  return out.str();
}

}  // namespace baton
