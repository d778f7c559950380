#include "perf/gpu/gpu_check_pair.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "perf/gpu/gpu_check_daemon.h"

namespace baton {
namespace {

using json = nlohmann::json;

// The pair's configuration: the test engines (or `engine_command`) taking the device memory,
// the tiny model in DIR/model, a pool of 8 chunks of 16 MiB (so a canary can have chunks of
// its own).
std::string PairConfig(const PairStepOptions& o, const std::string& dir) {
  std::vector<std::string> command = o.engine_command;
  if (command.empty()) {
    command = {o.bin_dir + "/baton_test_engine_helper", "--device-memory", "--read-quarantine",
               "--violations-dir", "{dir}/violations"};
  }
  std::ostringstream out;
  out << "[model]\ndir = " << json(dir + "/model") << "\nlock = false\n"
      << "[engine]\ncommand = [";
  for (size_t i = 0; i < command.size(); ++i) {
    std::string arg = command[i];
    if (size_t at = arg.find("{dir}"); at != std::string::npos) arg.replace(at, 5, dir);
    out << (i == 0 ? "" : ", ") << json(arg);  // a JSON string is a TOML basic string
  }
  out << "]\n";
  if (o.promote_timeout_ms > 0) out << "promote_timeout_ms = " << o.promote_timeout_ms << "\n";
  out << "[pool]\nblocks = 64\nblock_bytes = 2097152\n"
      << "[gpu]\nbackend = \"cuda\"\ndevice = " << o.device << "\npool_chunk_bytes = 16777216\n";
  return out.str();
}

// A canary of the engines' own command beside the primary on the device pool, at 50 % for
// long enough that both stamp their blocks, then rolled back: whole chunks each (no chunk
// leased to both, which the controller's invariant check would name), no header of the
// other engine found in a block (the violation files), and the chunks back with the primary.
json CanaryStep(const StepController& pair, const json& ready, const std::string& dir) {
  json r;
  std::string command;
  for (const json& arg : ready["upgrade"].value("active_command", json::array())) {
    command += " '" + arg.get<std::string>() + "'";
  }
  const json up = pair.Ctl("upgrade --steps 50,100 --step-ms 600000 --" + command);
  if (!up.is_object() || !up.value("ok", false))
    return FailStep(r, "upgrade refused: " + up.dump());
  bool held = false;
  const json canary = pair.WaitFor(
      [](const json& s) {
        return s.contains("upgrade") && s["upgrade"]["current"].is_object() &&
               s["upgrade"]["current"].value("phase", "") == "canary" &&
               EngineWithRole(s, "canary").value("blocks", 0) > 0;
      },
      &held);
  if (!held) return FailStep(r, "the canary never served; see controller.log");
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // both stamp their blocks
  r["canary_blocks"] = EngineWithRole(canary, "canary")["blocks"];
  r["primary_blocks"] = EngineWithRole(canary, "primary")["blocks"];
  r["canary_extents"] = EngineWithRole(canary, "canary")["extents"];
  r["primary_extents"] = EngineWithRole(canary, "primary")["extents"];
  r["canary_device_memory"] = EngineWithRole(canary, "canary").value("device_memory", "");
  r["invariants_during"] = pair.Ctl("status").value("invariants", "");
  if (!pair.Ctl("rollback").value("ok", false)) return FailStep(r, "rollback refused");
  const json after = pair.WaitFor(
      [](const json& s) {
        return IsReady(s) && !s["upgrade"]["history"].empty() &&
               s["pool"]["free"] == s["pool"]["promotion_reserve"]["target"];
      },
      &held);
  if (!held) return FailStep(r, "the rollback did not end with a ready pair; see controller.log");
  r["outcome"] = after["upgrade"]["history"].back().value("outcome", "");
  r["invariants"] = after.value("invariants", "");
  r["violations"] = CountFiles(dir + "/violations");
  r["ok"] = r["canary_device_memory"] == "mapped" && r["invariants_during"] == "ok" &&
            r["invariants"] == "ok" && r["violations"] == 0 && r["outcome"] == "rolled_back";
  return r;
}

}  // namespace

json PairStep(const PairStepOptions& o) {
  const std::string dir = o.work_dir + "/" + o.name;
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::filesystem::create_directories(dir + "/violations", ec);
  json r{{"dir", dir}};
  const std::string mk = o.bin_dir + "/baton-mkmodel --out " + dir + "/model --preset tiny";
  if (std::system((mk + " > " + dir + "/mkmodel.log 2>&1").c_str()) != 0) {
    return FailStep(r, "baton-mkmodel failed; see mkmodel.log");
  }
  StepController pair(o.bin_dir, dir, o.timeout_s);
  if (!pair.WriteConfig(PairConfig(o, dir)) || !pair.Start()) {
    return FailStep(r, "could not start baton-controller");
  }
  bool held = false;
  const json before = pair.WaitFor(IsReady, &held);
  if (!held) return FailStep(r, "no ready pair; see controller.log");
  r["device"] = before["device"];
  const json primary = EngineWithRole(before, "primary");
  const uint64_t old_id = primary.value("id", uint64_t{0});
  if (o.reports > 0 && WaitForReports(dir, 1, o.timeout_s).is_null()) {
    return FailStep(r, "the primary wrote no report; see controller.log");
  }
  if (::kill(primary.value("pid", 0), SIGKILL) != 0)
    return FailStep(r, "could not kill the primary");
  const json after = pair.WaitFor(
      [old_id](const json& s) {
        return IsReady(s) && EngineWithRole(s, "primary").value("id", uint64_t{0}) != old_id;
      },
      &held);
  if (!held) return FailStep(r, "the standby was not promoted; see controller.log");
  json memory = json::array();
  for (const json& e : after["engines"]) memory.push_back(e.value("device_memory", ""));
  r["engines_device_memory"] = memory;
  // The promotion did not wait for the old primary's teardown; its blocks left quarantine
  // once its context was gone (the reap, NVML): the timeline has both, side by side.
  bool drained = false;
  pair.WaitFor([](const json& s) { return s["pool"].value("quarantined", -1) == 0; }, &drained);
  r["timeline"] = pair.Ctl("timeline").value("timeline", json());
  const json phases =
      r["timeline"].is_object() ? r["timeline"].value("phases", json::object()) : json::object();
  r["ready_ms"] = phases.value("ready_ms", -1.0);
  r["teardown_ms"] = phases.value("teardown_ms", -1.0);
  r["promoted_before_barrier"] =
      r["timeline"].is_object() &&
      r["timeline"].value("promotion", json::object()).value("before_barrier", false);
  r["invariants"] = after.value("invariants", "");
  // The test engine read the dead primary's quarantined chunks through the SDK's read-only
  // mapping before their barrier (or found them granted first), and its stamps landed in them
  // once their grant had made them writable in place.
  const uint64_t new_id = EngineWithRole(after, "primary").value("id", uint64_t{0});
  std::ifstream read(dir + "/quarantine-read-" + std::to_string(new_id) + ".txt");
  std::string quarantine_read;
  std::getline(read, quarantine_read);
  if (o.engine_command.empty()) r["quarantine_read"] = quarantine_read;
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // let the new primary stamp
  const size_t violations = CountFiles(dir + "/violations");
  r["violations"] = violations;
  if (o.engine_command.empty()) r["canary"] = CanaryStep(pair, after, dir);
  bool reports_ok = true;
  if (o.reports > 0) {
    r["engines"] = WaitForReports(dir, o.reports, o.timeout_s);
    reports_ok = r["engines"].is_array();
    for (const json& e : reports_ok ? r["engines"] : json::array()) {
      reports_ok = reports_ok && e.is_object() && e.value("ok", false);
    }
    if (!r["engines"].is_array())
      r["error"] =
          "fewer than " + std::to_string(o.reports) + " engine reports; see controller.log";
  }
  pair.Stop();
  bool mapped = !memory.empty();
  for (const json& m : memory) mapped = mapped && m == "mapped";
  // The failover must be the kill, seen first as the exit or as the closed socket (a race the
  // controller resolves either way); an engine whose device copies failed reports an error.
  const std::string cause = r["timeline"].is_object() ? r["timeline"].value("cause", "") : "";
  const bool killed = cause.rfind("died", 0) == 0 || cause.rfind("connection lost", 0) == 0;
  const bool canary_ok = !r.contains("canary") || r["canary"].value("ok", false);
  r["ok"] = mapped && violations == 0 && r["invariants"] == "ok" &&
            r["device"].value("backend", "") == "cuda" && killed && reports_ok && canary_ok &&
            drained && r["promoted_before_barrier"].get<bool>();
  return r;
}

json TorchStep(PairStepOptions o, const std::string& script) {
  if (::access(script.c_str(), R_OK) != 0) {
    return json{{"ok", false}, {"error", "no engine script at " + script}};
  }
  o.name = "torch";
  o.engine_command = {"python3",      script,         "--lib", o.bin_dir + "/../lib",
                      "--report-dir", "{dir}/reports"};
  o.reports = 2;
  o.promote_timeout_ms = 30000;  // PyTorch starts before it connects; this is a margin
  return PairStep(o);
}

}  // namespace baton
