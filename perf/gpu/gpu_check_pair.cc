#include "perf/gpu/gpu_check_pair.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "perf/gpu/gpu_check_daemon.h"
#include "perf/pair/failover_procs.h"

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
  const std::string model = o.model_dir.empty() ? dir + "/model" : o.model_dir;
  out << "[model]\ndir = " << json(model) << "\nlock = false\n"
      << "[engine]\ncommand = [";
  for (size_t i = 0; i < command.size(); ++i) {
    std::string arg = command[i];
    if (size_t at = arg.find("{dir}"); at != std::string::npos) arg.replace(at, 5, dir);
    out << (i == 0 ? "" : ", ") << json(arg);  // a JSON string is a TOML basic string
  }
  out << "]\n";
  if (o.promote_timeout_ms > 0) out << "promote_timeout_ms = " << o.promote_timeout_ms << "\n";
  // Every failover of the step is a kill: none of them may trip the crash-loop guard.
  out << "[policy]\nmax_failures = 1000\n"
      << "[pool]\nblocks = 64\nblock_bytes = 2097152\n"
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

// One kill -9 of the primary of the ready pair `*ready`: the standby promoted (onto the
// promotion reserve, without waiting for the dead primary's teardown), a new standby ready and
// the dead primary's blocks out of quarantine (their barrier passed); `*ready` becomes that
// pair. The failover's phases from its timeline, ready_ms and teardown_ms side by side, and
// (the test engine) what the new primary read of the quarantined chunks before their grant.
json Failover(const StepController& pair, const PairStepOptions& o, const std::string& dir,
              json* ready) {
  json f;
  const json primary = EngineWithRole(*ready, "primary");
  const uint64_t old_id = primary.value("id", uint64_t{0});
  const int64_t pid = primary.value("pid", int64_t{0});
  f["killed_pid"] = pid;
  if (pid <= 0 || ::kill(static_cast<pid_t>(pid), SIGKILL) != 0) {
    return FailStep(f, "could not kill the primary");
  }
  bool held = false;
  const json after = pair.WaitFor(
      [old_id](const json& s) {
        return IsReady(s) && EngineWithRole(s, "primary").value("id", uint64_t{0}) != old_id;
      },
      &held);
  if (!held) return FailStep(f, "the standby was not promoted; see controller.log");
  json memory = json::array();
  for (const json& e : after["engines"]) memory.push_back(e.value("device_memory", ""));
  f["engines_device_memory"] = memory;
  // The dead primary's blocks out of quarantine (their barrier passed) and the promotion
  // reserve whole again (reclaimed from the new primary): the next failover starts on it.
  bool drained = false;
  const json settled = pair.WaitFor(
      [](const json& s) {
        if (!s.is_object() || !s.contains("pool")) return false;
        const json reserve = s["pool"].value("promotion_reserve", json::object());
        return s["pool"].value("quarantined", -1) == 0 &&
               reserve.value("available", -1) >= reserve.value("target", 0);
      },
      &drained);
  f["drained"] = drained;
  if (settled.is_object() && settled.contains("pool")) {
    f["reserve_available"] =
        settled["pool"].value("promotion_reserve", json::object()).value("available", -1);
  }
  const json timeline = pair.Ctl("timeline").value("timeline", json());
  if (!timeline.is_object() || timeline.value("old_pid", int64_t{0}) != pid) {
    return FailStep(f, "no timeline of this failover: " + timeline.dump());
  }
  const json phases = timeline.value("phases", json::object());
  f["ready_ms"] = phases.value("ready_ms", -1.0);
  f["teardown_ms"] = phases.value("teardown_ms", -1.0);
  f["promoted_before_barrier"] =
      timeline.value("promotion", json::object()).value("before_barrier", false);
  const std::string cause = timeline.value("cause", "");
  f["cause"] = cause;
  f["killed"] = cause.rfind("died", 0) == 0 || cause.rfind("connection lost", 0) == 0;
  f["epoch"] = timeline.value("epoch", uint64_t{0});
  f["invariants"] = after.value("invariants", "");
  f["timeline"] = timeline;
  if (o.engine_command.empty()) {
    // The test engine read the dead primary's quarantined chunks through the SDK's read-only
    // mapping before their barrier (or found them granted first); its stamps landed in them
    // once their grant had made them writable in place.
    const uint64_t new_id = EngineWithRole(after, "primary").value("id", uint64_t{0});
    std::ifstream read(dir + "/quarantine-read-" + std::to_string(new_id) + ".txt");
    std::string line;
    std::getline(read, line);
    f["quarantine_read"] = line;
  }
  *ready = after;
  return f;
}

// The failovers' ready_ms and teardown_ms (p50, p99 and max), whether every promotion came
// before its barrier and every quarantine drained, the invariant check, and the last
// failover's whole timeline, into `r`; the step's targets where it has them.
void Summarize(json& failovers, const PairStepOptions& o, json& r) {
  std::vector<double> ready, teardown;
  bool before_barrier = true, drained = true;
  std::string invariants = "ok";
  bool timed = true;  // every failover has both phases in its timeline
  for (json& f : failovers) {
    const double ready_ms = f.value("ready_ms", -1.0), teardown_ms = f.value("teardown_ms", -1.0);
    timed = timed && ready_ms >= 0 && teardown_ms >= 0;
    if (ready_ms >= 0) ready.push_back(ready_ms);
    if (teardown_ms >= 0) teardown.push_back(teardown_ms);
    before_barrier = before_barrier && f.value("promoted_before_barrier", false);
    drained = drained && f.value("drained", false);
    if (f.value("invariants", "") != "ok") invariants = f.value("invariants", "missing");
    r["timeline"] = f["timeline"];
    f.erase("timeline");
  }
  r["failover_count"] = failovers.size();
  r["ready_ms"] = perf::Percentile(ready, 50);
  r["ready_ms_p99"] = perf::Percentile(ready, 99);
  r["ready_ms_max"] = perf::Percentile(ready, 100);
  r["teardown_ms"] = perf::Percentile(teardown, 50);
  r["teardown_ms_p99"] = perf::Percentile(teardown, 99);
  r["promoted_before_barrier"] = before_barrier;
  r["timed"] = timed;
  r["drained"] = drained;
  r["invariants"] = invariants;
  if (!failovers.empty() && failovers[0].contains("quarantine_read")) {
    r["quarantine_read"] = failovers[0]["quarantine_read"];
  }
  if (o.ready_p50_target_ms > 0) {
    r["targets"] = {{"ready_ms_p50", o.ready_p50_target_ms},
                    {"ready_ms_p99", o.ready_p99_target_ms}};
    r["meets_targets"] = timed && !ready.empty() &&
                         perf::Percentile(ready, 50) <= o.ready_p50_target_ms &&
                         perf::Percentile(ready, 99) <= o.ready_p99_target_ms;
  }
}

}  // namespace

json PairStep(const PairStepOptions& o) {
  const std::string dir = o.work_dir + "/" + o.name;
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::filesystem::create_directories(dir + "/violations", ec);
  json r{{"dir", dir}};
  if (o.model_dir.empty()) {
    const std::string mk = o.bin_dir + "/baton-mkmodel --out " + dir + "/model --preset tiny";
    if (std::system((mk + " > " + dir + "/mkmodel.log 2>&1").c_str()) != 0) {
      return FailStep(r, "baton-mkmodel failed; see mkmodel.log");
    }
  }
  StepController pair(o.bin_dir, dir, o.timeout_s);
  if (!pair.WriteConfig(PairConfig(o, dir)) || !pair.Start()) {
    return FailStep(r, "could not start baton-controller");
  }
  bool held = false;
  json ready = pair.WaitFor(IsReady, &held);
  if (!held) return FailStep(r, "no ready pair; see controller.log");
  r["device"] = ready["device"];
  r["weights_bytes"] = ready["device"].value("weights_bytes", uint64_t{0});
  json failovers = json::array();
  json memory = json::array();
  for (int i = 0; i < std::max(o.failovers, 1); ++i) {
    // The primary (the first one, or the one the last failover promoted) has written its
    // report before it is killed.
    if (o.reports > 0 && WaitForReports(dir, i + 1, o.timeout_s).is_null()) {
      return FailStep(r, "the primary wrote no report; see controller.log");
    }
    json f = Failover(pair, o, dir, &ready);
    const bool failed = f.contains("error");
    if (!failed) memory = f["engines_device_memory"];
    f.erase("engines_device_memory");
    failovers.push_back(std::move(f));
    r["failovers"] = failovers;
    if (failed)
      return FailStep(
          r, "failover " + std::to_string(i + 1) + ": " + failovers.back().value("error", ""));
  }
  r["engines_device_memory"] = memory;
  Summarize(failovers, o, r);
  r["failovers"] = failovers;  // without their timelines now (the last one is r["timeline"])
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // let the new primary stamp
  const size_t violations = CountFiles(dir + "/violations");
  r["violations"] = violations;
  if (o.engine_command.empty()) r["canary"] = CanaryStep(pair, ready, dir);
  bool reports_ok = true;
  if (o.reports > 0) {
    const int want = std::max(o.failovers, 1) + 1;  // the first primary and each promoted one
    r["engines"] = WaitForReports(dir, want, o.timeout_s);
    reports_ok = r["engines"].is_array();
    for (const json& e : reports_ok ? r["engines"] : json::array()) {
      reports_ok = reports_ok && e.is_object() && e.value("ok", false) &&
                   (!o.expect_torch || e.value("torch", false));
    }
    if (!reports_ok && r["engines"].is_array() && o.expect_torch) {
      r["error"] =
          "an engine did not compute with PyTorch on the GPU (its report's "
          "torch_reason); see the engines' reports";
    }
    if (!r["engines"].is_array())
      r["error"] = "fewer than " + std::to_string(want) + " engine reports; see controller.log";
  }
  pair.Stop();
  bool mapped = !memory.empty();
  for (const json& m : memory) mapped = mapped && m == "mapped";
  bool killed = true;  // each failover was the kill, seen as the exit or as the closed socket
  for (const json& f : failovers) killed = killed && f.value("killed", false);
  const bool canary_ok = !r.contains("canary") || r["canary"].value("ok", false);
  r["ok"] = mapped && violations == 0 && r["invariants"] == "ok" &&
            r["device"].value("backend", "") == "cuda" && killed && reports_ok && canary_ok &&
            r["drained"].get<bool>() && r["promoted_before_barrier"].get<bool>() &&
            r["timed"].get<bool>();
  return r;
}

json TorchStep(PairStepOptions o, const std::string& script) {
  if (::access(script.c_str(), R_OK) != 0) {
    return json{{"ok", false}, {"error", "no engine script at " + script}};
  }
  o.name = "torch";
  o.engine_command = {"python3",      script,         "--lib", o.bin_dir + "/../lib",
                      "--report-dir", "{dir}/reports"};
  o.reports = 1;                 // each engine that is promoted writes one
  o.promote_timeout_ms = 30000;  // PyTorch starts before it connects; this is a margin
  o.ready_p50_target_ms = 10;    // docs/gpu.md, "What a GPU run must show"
  o.ready_p99_target_ms = 25;
  return PairStep(o);
}

}  // namespace baton
