// The processes of the router load drivers (baton-perf-router-overhead and
// baton-perf-failover-load): the tiny generated model, a standalone baton-refengine, a
// baton-router (with a static backend or subscribed to a controller) and a baton-controller
// running a primary and a standby reference engine. Each start waits until the process
// answers HTTP (or its controller reports a ready pair) and fails with the log's path when
// it exits or takes too long.
//
// Ownership: a ServingProcess / ControllerPair owns its process (killed and reaped when it
// goes). Thread: the driver's main thread.
#pragma once

#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "perf/pair/failover_procs.h"
#include "standby/mkmodel/model_writer.h"

namespace baton::perf {

// Writes baton-mkmodel's tiny preset (seed 1) into `dir`, or keeps it when it matches.
Result<ModelSummary> EnsureTinyModel(const std::string& dir);

struct ServingProcess {
  ChildProcess process;
  std::string address;  // "127.0.0.1:PORT"
  std::string log;
};

// Polls GET `path` on `address` until it answers `want_status`; fails when `process` exits
// or `limit` passes.
Status WaitForHttpStatus(const std::string& address, std::string_view path, int want_status,
                         std::chrono::milliseconds limit, ServingProcess* process);

// baton-refengine on `model_dir` with its own weights, listening on an ephemeral port.
Result<ServingProcess> StartStandaloneEngine(const std::string& bin_dir,
                                             const std::string& model_dir,
                                             const std::string& served_name,
                                             const std::string& work_dir,
                                             const std::vector<std::string>& extra_args);

// baton-router on a free loopback port with `args` (--backend or --controller, ...); ready
// once /health answers 200 (a primary is known).
Result<ServingProcess> StartRouterProcess(const std::string& bin_dir,
                                          const std::vector<std::string>& args,
                                          const std::string& log);

struct PairConfig {
  std::string served_name;
  int pool_blocks = 1024;
  int block_bytes = 64 << 10;
  int engine_threads = 1;
  std::vector<std::string> engine_args = {};  // appended to the reference engine's command
  std::string extra_toml = {};                // whole sections appended ("[fleet]\n...")
};

class ControllerPair {
 public:
  // Writes WORK/controller.toml and starts baton-controller; returns once the pair is ready.
  static Result<ControllerPair> Start(const std::string& bin_dir, const std::string& model_dir,
                                      const std::string& work_dir, const PairConfig& config);

  // `batonctl --json ARGS...` against this controller.
  Result<nlohmann::json> Ctl(const std::vector<std::string>& args) const;
  // Polls status until the pair is ready (a serving primary and a standby); the status.
  Result<nlohmann::json> WaitReady(std::chrono::milliseconds limit);
  // SIGTERM (SIGKILL after 15 s); the exit status.
  int Stop() { return controller_.has_value() ? controller_->Stop(std::chrono::seconds(15)) : -1; }
  // kill -9 of the controller, reaped; its engines and baton-keeper live on.
  void Kill();
  // Starts baton-controller again on the same configuration, as systemd's Restart=always
  // would after a crash; does not wait for it.
  Status Respawn();
  pid_t pid() const { return controller_.has_value() ? controller_->pid() : 0; }

  const std::string& socket() const { return socket_; }
  const std::string& log() const { return log_; }

 private:
  ControllerPair(ChildProcess controller, std::string bin_dir, std::string socket, std::string log,
                 std::string config)
      : controller_(std::move(controller)),
        bin_dir_(std::move(bin_dir)),
        socket_(std::move(socket)),
        log_(std::move(log)),
        config_(std::move(config)) {}

  std::optional<ChildProcess> controller_;
  std::string bin_dir_;
  std::string socket_;
  std::string log_;
  std::string config_;  // the controller's TOML
};

// The ready primary in a `batonctl status` object: its engine id, pid and HTTP address.
struct PrimaryInfo {
  uint64_t engine_id = 0;
  int pid = 0;
  std::string address;
};
PrimaryInfo PrimaryOf(const nlohmann::json& status);

}  // namespace baton::perf
