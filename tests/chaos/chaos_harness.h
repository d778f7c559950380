// ChaosCluster: a real baton-controller with real engine processes, for the chaos tests.
//
// Each cluster gets its own directory under /tmp (config, socket, journal, controller log,
// violation files, rogue file), starts build/bin/baton-controller (its log appended across
// restarts) with
// build/bin/baton_test_engine_helper as the engine command, and talks to it only through
// build/bin/batonctl --json (so every check also exercises the CLI contract). Waits poll
// `batonctl status` until a condition holds, with generous deadlines: nothing asserts on how
// long anything took. The destructor stops the controller (SIGTERM, then SIGKILL) and checks
// that no engine and no baton-keeper outlived it; when a test left the controller killed, it
// kills what the roster lists and the keeper.
//
// CheckFencing() verifies the fencing invariants from outside: the controller's own ledger
// check, the test engines' block-header checks (violation files), and the kernel's view of
// every engine's mappings of the pool memfd in /proc/<pid>/maps (a standby maps nothing of
// the pool; no two live engines map a block writable).
//
// Header-only test support (the test build compiles *_test.cc files only); the definitions
// are in chaos_harness_inl.h and chaos_status_inl.h. Used from the test's main thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace baton::chaos {

using nlohmann::json;

struct ClusterOptions {
  std::vector<std::string> engine_args;     // appended to the test engine's command line
  std::vector<std::string> engine_command;  // replaces the whole engine command when set
  std::vector<std::string> engine_wrapper;  // put before the engine command (a shell, say)
  int blocks = 16;
  int block_bytes = 65536;  // 2 MiB multiples use a hugetlb pool when huge pages are reserved
  int promotion_reserve_blocks = -1;  // [pool] promotion_reserve_blocks when >= 0
  int heartbeat_ms = 100;
  int heartbeat_misses = 3;
  int probe_timeout_ms = 100;
  int compute_stall_timeout_ms = -1;  // [health] compute_stall_timeout_ms when >= 0
  std::string model_dir;              // the model; empty: the tiny one (TinyModelDir)
  bool weights_huge_pages = true;     // [model] huge_pages: false puts the arena on 4 KiB pages
  int weights_max_huge_pages = -1;    // [model] max_huge_pages when >= 0 (a partial arena)
  int max_failures = 5;
  int initial_backoff_ms = 1000;
  int standby_relaunch_delay_ms = -1;  // [policy] standby_relaunch_delay_ms when >= 0
  int register_timeout_ms = 20'000;
  int promote_timeout_ms = 10'000;
  std::string first_engine_rogue;  // the first engine misbehaves as this rogue mode when set
  int metrics_port = 0;
  int base_port = 0;           // [engine] base_port: engines on base_port.. (0: ephemeral ports)
  uint64_t epoch_reserve = 0;  // [controller] epoch_reserve when > 0
  bool wait_ready = true;      // the constructor waits for primary + standby
  // How long WaitReady (and the constructor) waits: engines that import a framework (the
  // PyTorch pair) start in seconds alone and far later beside the suite's other tests.
  std::chrono::seconds ready_timeout{20};
  std::string gpu_backend;            // [gpu] backend when set (auto | host | cuda)
  int gpu_probe_ms = 0;               // [gpu] probe_interval_ms when set
  uint64_t gpu_pool_chunk_bytes = 0;  // [gpu] pool_chunk_bytes when set
  // [upgrade] max_latency_ratio. Canary latency is not judged in chaos tests: they run in
  // parallel on small CI machines, where a fresh engine's first requests can take twice as long
  // as the warm primary's. tests/controller/core/canary_test.cc covers the latency rule.
  double max_latency_ratio = 1000;
  // [controller] readopt_timeout_ms when > 0: how long a restarted controller waits for the
  // previous one's engines.
  int readopt_timeout_ms = 0;
  std::string engine_cgroup;  // [engine] cgroup when set ("off": process groups only)
  bool engine_logs = false;   // [engine] log_dir = <dir>/engine-logs (else the controller's)
  int engine_log_keep = 0;    // [engine] log_keep when > 0
  // The first controller's extra environment ("NAME=value": BATON_FAILPOINTS=...).
  std::vector<std::string> controller_env;
  // TOML appended to the controller's configuration (whole sections: "[fleet]\n...").
  std::string extra_toml;
  std::string router_socket;    // [controller] router_socket when set
  std::string engine_key_file;  // [engine] key_file when set
};

// `o` with health settings for a test that exercises no detection timing and asserts that
// nothing was fenced: an engine is taken for hung after 10 missed heartbeats of 100 ms and a
// 500 ms probe (1.5 s), not after the defaults' 400 ms that a loaded host may leave one
// unscheduled for.
inline ClusterOptions TolerantHealth(ClusterOptions o = {}) {
  o.heartbeat_ms = 100;
  o.heartbeat_misses = 10;
  o.probe_timeout_ms = 500;
  return o;
}

struct CtlResult {
  int exit_code = -1;
  json out;  // the last stdout line parsed as JSON (null if it was not JSON)
  std::string stdout_text;
};

class ChaosCluster {
 public:
  explicit ChaosCluster(ClusterOptions options = {});
  ~ChaosCluster();
  ChaosCluster(const ChaosCluster&) = delete;
  ChaosCluster& operator=(const ChaosCluster&) = delete;

  // `batonctl --json --socket S args...`.
  CtlResult Ctl(const std::vector<std::string>& args) const;
  // `batonctl --socket S args... 2>&1`: what an operator reads (`out` is null).
  CtlResult CtlPlain(const std::vector<std::string>& args) const;
  json Status() const;

  // Polls status until `pred` holds; on timeout records a failure naming `what` and returns
  // the last status seen.
  json WaitFor(const std::function<bool(const json&)>& pred, const std::string& what,
               std::chrono::seconds timeout = std::chrono::seconds(20)) const;
  // Pair ready: a serving primary and a registered standby, waited for up to the options'
  // ready_timeout.
  json WaitReady(const std::string& what = "pair ready") const;

  // Fencing checks (see above), once the pair is ready or a canary serves; records failures
  // with the status attached.
  void CheckFencing() const;

  bool ControllerAlive() const;
  // kill -9 the controller and reap it. Its engines and baton-keeper live on.
  void KillController();
  // Starts a controller again on the same directory (journal, socket, roster, keeper) and
  // waits for a pair.
  void RestartController();
  // Starts a controller again without waiting; `env` ("NAME=value") goes into its
  // environment only (BATON_FAILPOINTS=...).
  void StartControllerAgain(const std::vector<std::string>& env = {}) { StartController(env); }
  // Waits for the controller to exit by itself (a failpoint, `batonctl controller restart`)
  // and reaps it; returns its waitpid status (-1 and a failure after `timeout`).
  int WaitControllerExit(std::chrono::seconds timeout = std::chrono::seconds(20));
  // SIGTERM the controller, wait for it (SIGKILL after 20 s, a failure) and check that no
  // engine and no baton-keeper outlived it. Returns its waitpid status (-1 if it was not
  // running).
  int StopController();
  std::string Log() const;
  const std::string& dir() const { return dir_; }
  const std::string& socket() const { return socket_; }
  const std::string& rogue_file() const { return rogue_file_; }
  pid_t controller_pid() const { return controller_pid_; }
  // Writes the rogue file: the next engine to start misbehaves as `mode`.
  void ArmRogue(const std::string& mode) const;
  // The engine pids the roster lists (none <= 0), and baton-keeper's pid (0: not running).
  std::vector<pid_t> RosterPids() const;
  pid_t KeeperPid() const;
  // SIGKILL to every process the roster lists (with its group) and to baton-keeper; then the
  // engines' cgroups are emptied and removed, as the next controller on this runtime
  // directory would (a controller killed for good leaves them behind).
  void KillLeftovers();

 private:
  void WriteConfig(const ClusterOptions& options) const;
  CtlResult RunCtl(bool json_output, const std::vector<std::string>& args) const;
  void StartController(const std::vector<std::string>& env = {});

  std::string dir_;
  std::string socket_;
  std::chrono::seconds ready_timeout_{20};
  std::string rogue_file_;
  std::string violations_dir_;
  pid_t controller_pid_ = 0;
};

// --- status helpers ---------------------------------------------------------------------------

// The engine whose role is `role` ("primary", "standby"), or null.
json EngineWithRole(const json& status, const std::string& role);
uint64_t PrimaryId(const json& status);
pid_t PidOf(const json& engine);
// The durable epoch.
uint64_t Epoch(const json& status);
bool IsReady(const json& status);
// Ready, with nothing quarantined and the promotion reserve whole again: a failover's old
// primary is past its barrier and its blocks have moved on.
bool Settled(const json& status);
// The pool's blocks less the promotion reserve: what a primary holds once settled.
int BlocksBesideTheReserve(const json& status);
// Waits for a ready pair whose primary is not `old_primary` (a kill is seen asynchronously:
// right after it the status may still show the old primary ready).
json WaitNewPrimary(const ChaosCluster& cluster, uint64_t old_primary, const std::string& what,
                    std::chrono::seconds timeout = std::chrono::seconds(20));
// True if a process with this pid exists (a zombie counts).
bool ProcessExists(pid_t pid);
// A loopback TCP port that was free a moment ago (0 if none could be had).
int FreeTcpPort();
// The tiny model shared by every test in the binary (written once).
const std::string& TinyModelDir();
// The tiny model with 24 layers, about 5 MiB: three huge pages' worth, for partial arenas.
const std::string& FiveMiBModelDir();
// HugePages_Free of /proc/meminfo (0 when absent).
long HugePagesFree();

// A file that holds back whatever waits on it (an engine wrapper, a test engine's hold flag)
// while it exists: a step the test begins and ends when it chooses, not after a sleep. Made
// closed (the file there); removed at the latest when the GateFile goes.
class GateFile {
 public:
  explicit GateFile(const std::string& name);
  ~GateFile() { Open(); }
  GateFile(const GateFile&) = delete;
  GateFile& operator=(const GateFile&) = delete;
  void Close() const;
  void Open() const;
  // A shell line that waits while the gate is closed.
  std::string ShellWait() const { return "while [ -e " + path_ + " ]; do sleep 0.05; done; "; }
  const std::string& path() const { return path_; }

 private:
  const std::string path_;
};

}  // namespace baton::chaos

#include "tests/chaos/chaos_harness_inl.h"
#include "tests/chaos/chaos_status_inl.h"
