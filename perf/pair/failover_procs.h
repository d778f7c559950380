// Child processes and small helpers of baton-perf-failover: a spawned process with its
// output in a log file (killed and reaped when its handle goes), batonctl calls parsed as
// JSON, percentiles, and the timestamps of Baton's log lines.
//
// Ownership: a ChildProcess owns its process until it is reaped. Thread: the driver's one
// thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"

namespace baton::perf {

class ChildProcess {
 public:
  // Starts argv[0] (a path) with stdin /dev/null and stdout + stderr appended to `log_path`.
  static Result<ChildProcess> Spawn(const std::vector<std::string>& argv,
                                    const std::string& log_path);

  ChildProcess(ChildProcess&& other) noexcept : pid_(other.pid_) { other.pid_ = 0; }
  ChildProcess& operator=(ChildProcess&&) = delete;
  ChildProcess(const ChildProcess&) = delete;
  ~ChildProcess();  // SIGKILL and reap when still running

  pid_t pid() const { return pid_; }
  // True while the process has not exited (reaps it when it has).
  bool Running();
  // SIGTERM, then SIGKILL after `grace`; returns the exit status (128 + signal when killed).
  int Stop(std::chrono::milliseconds grace);

 private:
  explicit ChildProcess(pid_t pid) : pid_(pid) {}
  pid_t pid_ = 0;  // 0 once reaped
  int exit_code_ = -1;
};

// Runs `batonctl --json --socket SOCKET --timeout-ms 2000 ARGS...` and parses its last
// stdout line; an error when it fails or says "ok": false.
Result<nlohmann::json> BatonctlJson(const std::string& batonctl, const std::string& socket,
                                    const std::vector<std::string>& args);

// An error naming the crash loop when a `batonctl status` object says the controller's
// crash-loop guard holds the pair down (pair state down_backoff: no primary, and every engine
// started has failed): waiting for readiness then gives up at once instead of waiting out its
// limit. OK otherwise (a degraded_backoff pair still serves). `log`: the controller's log.
Status CrashLoopStatus(const nlohmann::json& status, const std::string& log);

// The port an engine started with `--port 0 --port-file PATH` wrote to PATH, polled every
// `poll` until `timeout`; Unavailable when `child` exits first (its log is `log`).
Result<uint16_t> WaitForPortFile(const std::string& path, ChildProcess& child,
                                 std::chrono::milliseconds timeout, std::chrono::microseconds poll,
                                 const std::string& log);

// Nearest-rank percentile (p in (0, 100]) of `v`; with fewer than 100 samples p99 is the
// maximum. 0 for an empty vector.
double Percentile(std::vector<double> v, double p);

// Microseconds since the Unix epoch of a log line's "YYYY-MM-DDTHH:MM:SS.uuuuuuZ" prefix.
std::optional<int64_t> LogLineMicros(std::string_view line);
// The first line of file `path` that contains every one of `needles`, or "".
std::string FindLine(const std::string& path, const std::vector<std::string>& needles);
// CLOCK_REALTIME now in microseconds since the epoch (to compare with log lines).
int64_t WallMicros();

}  // namespace baton::perf
