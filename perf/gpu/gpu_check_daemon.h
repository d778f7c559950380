// The real daemon as perf/gpu_check's steps run it (perf/gpu/gpu_check_pair.h,
// perf/gpu/gpu_check_restart.h): one baton-controller in a folder of its own (DIR/controller.toml,
// DIR/controller.log appended across restarts, DIR/run for its socket, state and keeper),
// spoken to through batonctl --json. StepController starts it (fork and exec), kills it as
// kill -9 would (its engines and baton-keeper live on) and stops it (SIGTERM, then SIGKILL after
// 10 s) on destruction, so that no step leaves a controller behind. Waits poll `batonctl
// status` with a deadline. Blocking; one thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

namespace baton {

// The last line of `command`'s stdout parsed as JSON (null when it is not JSON).
nlohmann::json RunJson(const std::string& command);
// The engine of `status` whose role is `role`, or null.
nlohmann::json EngineWithRole(const nlohmann::json& status, const std::string& role);
// A serving primary and a standby.
bool IsReady(const nlohmann::json& status);
// `r` with "ok": false and "error".
nlohmann::json FailStep(nlohmann::json r, const std::string& error);
// Entries in `dir` (0 when it does not exist).
size_t CountFiles(const std::string& dir);
// The engines' JSON reports in dir/reports once there are `want` of them (null at the deadline).
nlohmann::json WaitForReports(const std::string& dir, int want, int timeout_s);
// WORK/model-PRESET-DTYPE, written by bin_dir/baton-mkmodel unless it already holds that model
// (its log beside it, WORK/model-PRESET-DTYPE.log); "" when mkmodel fails. Steps that use the
// same preset share one model.
std::string StepModel(const std::string& bin_dir, const std::string& work_dir,
                      const std::string& preset, const std::string& dtype);

class StepController {
 public:
  StepController(std::string bin_dir, std::string dir, int timeout_s)
      : bin_dir_(std::move(bin_dir)), dir_(std::move(dir)), timeout_s_(timeout_s) {}
  ~StepController() { Stop(); }
  StepController(const StepController&) = delete;
  StepController& operator=(const StepController&) = delete;

  const std::string& dir() const { return dir_; }
  std::string Socket() const { return dir_ + "/run/controller.sock"; }
  // Writes DIR/controller.toml: `[controller] runtime_dir` and then `toml`.
  bool WriteConfig(const std::string& toml) const;
  // Starts baton-controller --config DIR/controller.toml; false when it cannot.
  bool Start();
  // SIGKILL and reap, as kill -9 would: its engines and baton-keeper live on.
  void Kill();
  // SIGTERM (a clean stop: engines stopped, kept memory let go), SIGKILL after 10 s.
  void Stop();
  pid_t pid() const { return pid_; }
  // When the running controller was spawned.
  std::chrono::steady_clock::time_point started_at() const { return started_at_; }

  nlohmann::json Ctl(const std::string& args) const;
  // Polls status until `pred` holds (held true) or `timeout_s` (0: the step's) passes; the
  // last status seen.
  nlohmann::json WaitFor(const std::function<bool(const nlohmann::json&)>& pred, bool* held,
                         int timeout_s = 0) const;
  std::string Log() const;

 private:
  std::string bin_dir_;
  std::string dir_;
  int timeout_s_;
  pid_t pid_ = -1;
  std::chrono::steady_clock::time_point started_at_{};
};

}  // namespace baton
