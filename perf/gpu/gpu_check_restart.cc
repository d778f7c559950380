#include "perf/gpu/gpu_check_restart.h"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <sstream>

#include "perf/gpu/gpu_check_daemon.h"

namespace baton {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr int kHeartbeatMs = 50;
constexpr int kHeartbeatMisses = 2;

// The test engines on the device, a pool of `pool_blocks` blocks of 2 MiB in 64 MiB chunks;
// `extra` goes into [model] and may open sections of its own.
std::string Config(const RestartStepOptions& o, const std::string& dir, const std::string& model,
                   int pool_blocks, const std::string& extra) {
  std::ostringstream out;
  const std::string engine = o.bin_dir + "/baton_test_engine_helper";
  out << "[model]\ndir = " << json(model) << "\nlock = false\n"
      << extra << "[engine]\ncommand = [" << json(engine)
      << ", \"--device-memory\", \"--violations-dir\", " << json(dir + "/violations") << "]\n"
      << "[pool]\nblocks = " << pool_blocks << "\nblock_bytes = 2097152\n"
      << "[gpu]\nbackend = \"cuda\"\ndevice = " << o.device << "\npool_chunk_bytes = 67108864\n";
  return out.str();
}

std::set<int64_t> Pids(const json& status) {
  std::set<int64_t> pids;
  for (const json& e : status.value("engines", json::array())) pids.insert(e.value("pid", 0));
  return pids;
}

// Kill -9 of the primary: the standby must be promoted (and a new standby registered).
json Failover(const StepController& c, const json& ready, int* launches_after) {
  json r;
  const json primary = EngineWithRole(ready, "primary");
  r["killed_pid"] = primary.value("pid", 0);
  const uint64_t old_id = primary.value("id", uint64_t{0});
  const uint64_t launches = ready["controller"].value("launches", uint64_t{0});
  if (::kill(static_cast<pid_t>(primary.value("pid", 0)), SIGKILL) != 0) {
    return FailStep(r, "could not kill the primary");
  }
  bool held = false;
  const json after = c.WaitFor(
      [&](const json& s) {
        return IsReady(s) && EngineWithRole(s, "primary").value("id", uint64_t{0}) != old_id &&
               s["controller"].value("launches", uint64_t{0}) > launches;
      },
      &held);
  if (!held) return FailStep(r, "no failover after kill -9 of the primary; see controller.log");
  *launches_after = static_cast<int>(after["controller"].value("launches", uint64_t{0}));
  r["timeline"] = c.Ctl("timeline").value("timeline", json());
  r["invariants"] = after.value("invariants", "");
  // The kill is seen as the exit, the closed socket, or (when tearing down a large arena on
  // 4 KiB pages outlasts the hang timeout) as silence.
  const std::string cause = r["timeline"].is_object() ? r["timeline"].value("cause", "") : "";
  r["cause"] = cause;
  r["ok"] = r["invariants"] == "ok" &&
            (cause.rfind("died", 0) == 0 || cause.rfind("connection lost", 0) == 0 ||
             cause.rfind("hung", 0) == 0);
  return r;
}

// Engines fenced as hung, other than the one the step killed (`killed`): a process killed with
// kill -9 exits only once the kernel has torn down its mappings, which on 4 KiB pages of a
// large arena can outlast the hang timeout; until then it neither heartbeats nor closes its
// socket, so its death may be seen as a hang.
size_t HangFences(const std::string& log, int64_t killed) {
  size_t n = 0;
  const std::string not_this = "(pid " + std::to_string(killed) + ",";
  for (size_t at = log.find("fenced: hung"); at != std::string::npos;
       at = log.find("fenced: hung", at + 1)) {
    const size_t begin = log.rfind('\n', at) + 1;
    if (killed == 0 || log.substr(begin, at - begin).find(not_this) == std::string::npos) ++n;
  }
  return n;
}

// One kill -9 of the controller and its start again: what the new controller adopted.
json RestartOnce(StepController& c, const json& before, double target_ms) {
  json r;
  c.Kill();
  if (!c.Start()) return FailStep(r, "could not start baton-controller again");
  const std::set<int64_t> pids = Pids(before);
  bool held = false;
  const json after = c.WaitFor(
      [&](const json& s) {
        return IsReady(s) && Pids(s) == pids &&
               !s["controller"]["recovery"].value("in_progress", true);
      },
      &held);
  r["spawn_to_ready_ms"] =
      std::chrono::duration<double, std::milli>(Clock::now() - c.started_at()).count();
  if (!held) return FailStep(r, "the same pair was not ready again; see controller.log");
  const json& recovery = after["controller"]["recovery"];
  const json& device = after["device"];
  r["readopt_ms"] = recovery["readopt_ms"];
  r["memory"] = recovery["memory"];
  r["fenced"] = recovery["fenced"].size();
  r["device_adopted"] = device.value("adopted", false);
  r["copied_bytes"] = device.value("copied_bytes", uint64_t{1});
  r["pin"] = device.value("pin", "");
  r["weights"] = after["weights"].value("load_method", "");
  r["same_pids"] = true;
  const double ready_ms =
      recovery["readopt_ms"].is_number() ? recovery["readopt_ms"].get<double>() : 1e9;
  r["ok"] = r["device_adopted"] == true && r["copied_bytes"] == 0 && r["fenced"] == 0 &&
            r["weights"] == "adopted" && ready_ms <= target_ms;
  if (!r["ok"].get<bool>()) r["error"] = "not adopted as it was, or not ready in time";
  return r;
}

}  // namespace

json RestartStep(const RestartStepOptions& o) {
  const std::string dir = o.work_dir + "/restart";
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::filesystem::create_directories(dir + "/violations", ec);
  json r{{"dir", dir}, {"model", o.preset + " " + o.dtype}, {"target_ready_ms", o.ready_target_ms}};
  const std::string model = StepModel(o.bin_dir, o.work_dir, o.preset, o.dtype);
  if (model.empty()) return FailStep(r, "baton-mkmodel failed; see the model's log");
  StepController c(o.bin_dir, dir, o.timeout_s);
  if (!c.WriteConfig(Config(o, dir, model, 512, "")) || !c.Start()) {
    return FailStep(r, "could not start baton-controller");
  }
  bool held = false;
  const json before = c.WaitFor(IsReady, &held);
  if (!held) return FailStep(r, "no ready pair; see controller.log");
  r["weights_bytes"] = before["device"].value("weights_bytes", uint64_t{0});
  r["first_start"] = {{"remat_ms", before["device"].value("remat_ms", 0.0)},
                      {"pin", before["device"].value("pin", "")},
                      {"pin_ms", before["device"].value("pin_ms", 0.0)},
                      {"copied_bytes", before["device"].value("copied_bytes", uint64_t{0})}};
  json restarts = json::array();
  bool ok = true;
  for (int i = 0; i < o.restarts; ++i) {
    json one = RestartOnce(c, before, o.ready_target_ms);
    ok = ok && one.value("ok", false);
    restarts.push_back(std::move(one));
    if (!restarts.back().contains("readopt_ms")) break;  // no pair: nothing to restart again
  }
  r["restarts"] = restarts;
  int launches = 0;
  r["failover"] = Failover(c, c.Ctl("status"), &launches);
  r["violations"] = CountFiles(dir + "/violations");
  c.Stop();
  r["ok"] = ok && r["failover"].value("ok", false) && r["violations"] == 0 &&
            before["device"].value("backend", "") == "cuda";
  return r;
}

json RegistrationStep(const RestartStepOptions& o) {
  const std::string dir = o.work_dir + "/registration";
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::filesystem::create_directories(dir + "/violations", ec);
  const int probe_ms = std::max(o.hang_timeout_ms - kHeartbeatMs * kHeartbeatMisses, 100);
  const int hang_timeout_ms = kHeartbeatMs * kHeartbeatMisses + probe_ms;
  json r{{"dir", dir}, {"model", o.preset + " " + o.dtype}, {"hang_timeout_ms", hang_timeout_ms}};
  const std::string model = StepModel(o.bin_dir, o.work_dir, o.preset, o.dtype);
  if (model.empty()) return FailStep(r, "baton-mkmodel failed; see the model's log");
  std::ostringstream health;
  health << "huge_pages = false\n[health]\nheartbeat_interval_ms = " << kHeartbeatMs
         << "\nheartbeat_misses = " << kHeartbeatMisses << "\nprobe_timeout_ms = " << probe_ms
         << "\n";
  StepController c(o.bin_dir, dir, o.timeout_s);
  // A small pool: the promotion maps and scrubs it on the SDK's heartbeat thread, and this
  // step is about the registration.
  if (!c.WriteConfig(Config(o, dir, model, 64, health.str())) || !c.Start()) {
    return FailStep(r, "could not start baton-controller");
  }
  bool held = false;
  const json ready = c.WaitFor(IsReady, &held);
  r["hung_fences"] = HangFences(c.Log(), 0);
  if (!held) return FailStep(r, "no ready pair; see controller.log");
  double prefault_ms = 0;
  for (const json& e : ready["engines"])
    prefault_ms = std::max(prefault_ms, e.value("prefault_ms", 0.0));
  r["arena_huge_pages"] = ready["weights"].value("huge_pages", true);
  r["prefault_ms_max"] = prefault_ms;
  r["prefault_past_hang_timeout"] = prefault_ms > hang_timeout_ms;
  int launches = 0;
  r["failover"] = Failover(c, ready, &launches);
  const json after = c.Ctl("status");
  for (const json& e : after.value("engines", json::array())) {
    prefault_ms = std::max(prefault_ms, e.value("prefault_ms", 0.0));
  }
  r["prefault_ms_max"] = prefault_ms;
  r["prefault_past_hang_timeout"] = prefault_ms > hang_timeout_ms;
  r["registrations"] = launches;
  r["hung_fences"] = HangFences(c.Log(), r["failover"].value("killed_pid", int64_t{0}));
  r["violations"] = CountFiles(dir + "/violations");
  c.Stop();
  r["ok"] = r["hung_fences"] == 0 && r["arena_huge_pages"] == false &&
            r["failover"].value("ok", false) && r["violations"] == 0;
  return r;
}

}  // namespace baton
