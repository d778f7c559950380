// ControllerConfig: everything `baton-controller` is told, from a TOML file (toml11) and/or
// command-line flags (flags override the file).
//
// ParseConfigToml() refuses unknown keys, wrong types and out-of-range values with an error
// that names the key (e.g. "pool.block_bytes: must be a multiple of 4096, got 1000");
// ParseControllerFlags() does the same for flags. docs/operations.md lists every key.
// The engine command is a list of arguments with placeholders {socket} {token} {role}
// {engine_id} {host} {port} {model_dir} {runtime_dir}, expanded per launch (see
// controller/engines/supervisor.h). Plain values; thread-compatible.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/status.h"
#include "controller/core/coordinator_config.h"

namespace baton {

// The keys the Coordinator reads are its CoordinatorConfig's (controller/core/
// coordinator_config.h); the rest are the daemon's.
struct ControllerConfig : CoordinatorConfig {
  // [controller]
  std::string runtime_dir;  // socket controller.sock lives here; default DefaultRuntimeDir()
  // Epochs each journal write reserves (controller/epoch_journal.h); 1: a write per epoch.
  uint64_t epoch_reserve = 64;
  std::string log_level = "info";
  int metrics_port = 0;  // 0: no /metrics endpoint
  std::string metrics_host = "127.0.0.1";
  std::string name = "baton-controller";
  // A second socket that serves routers only, for routers that run as another user: made
  // with mode 0660, its group the directory's when that is setgid (docs/operations.md, Users
  // and ports). Empty: routers use controller.sock.
  std::string router_socket;
  // Keep the weight arena and the pool in baton-keeper, so that a restarted controller
  // adopts them instead of loading the model again (controller/keeper/).
  bool keep_memory = true;

  // [model]
  std::string model_dir;
  int numa_node = -1;  // -1: automatic (see weightcache/io/pinned_arena.h)
  bool weights_huge_pages = true;
  // At most this many 2 MiB pages for the weight arena (the rest on 4 KiB pages); -1: as
  // many as are free. Leaves huge pages to others, e.g. to the pool.
  int weights_max_huge_pages = -1;
  bool weights_lock = true;

  // [engine]
  std::string engine_log_dir;  // empty: engines inherit the controller's stdout/stderr
  // Each engine's log is rotated past this (0: never) and the logs of all but the live
  // engines and the `engine_log_keep` most recent ids are deleted (engines/engine_logs.h).
  uint64_t engine_log_max_bytes = 64ull << 20;
  int engine_log_keep = 8;
  // The logs of the `engine_crash_log_keep` latest engines that failed (died, hung, ...: not
  // retired by the controller) are kept apart as engine-<id>.crash.log, whatever the
  // launches after them (0: not kept apart).
  int engine_crash_log_keep = 8;
  // "auto" | "off" | a cgroup v2 directory: where each engine gets a cgroup that fencing
  // kills whole (controller/engines/engine_cgroup.h).
  std::string engine_cgroup = "auto";
  // {host}: the address each engine listens on and announces to routers, which may run on
  // other hosts (a fleet): this node's address there, not the loopback.
  std::string engine_host = "127.0.0.1";
  // The engine key file (proto/http/engine_key.h): its keys go to every engine launched, in
  // BATON_ENGINE_KEYS, and engines then serve only the requests that carry one. Empty: none.
  std::string engine_key_file;
  Duration stop_grace = std::chrono::seconds(2);  // shutdown: Stop, then SIGKILL after this
  // What an engine does when its controller is gone this long (0: never decide): "serve"
  // (the primary keeps serving, the standby stays half-started, both keep reconnecting) or
  // "stop" (it exits). Passed to engines in BATON_CONTROLLER_ABSENT_TIMEOUT_MS and
  // BATON_ON_CONTROLLER_ABSENT.
  Duration controller_absent_timeout = std::chrono::seconds(0);
  std::string on_controller_absent = "serve";

  // [pool]
  uint64_t block_bytes = 2u << 20;
  bool pool_huge_pages = true;

  // [gpu]
  std::string gpu_backend = "auto";  // auto | host | cuda (cuda/driver/gpu_backend.h)
  int gpu_device = 0;                // CUDA device ordinal
  // CUDA backend: the most a device pool chunk holds. The driver maps whole chunks, so this
  // is also the unit a canary's share of the pool is counted in (docs/gpu.md).
  uint64_t gpu_pool_chunk_bytes = 256ull << 20;

  // [fleet]: the node's record in etcd (docs/fleet.md); off while fleet_etcd is empty.
  std::vector<std::string> fleet_etcd;  // member endpoints ("host:port", "http://", "https://")
  std::string fleet_prefix = "/baton/";
  std::string fleet_node;   // default: the host name
  std::string fleet_model;  // the served model's name; default: the model directory's name
  Duration fleet_lease_ttl = std::chrono::seconds(2);
  Duration fleet_etcd_timeout = std::chrono::seconds(1);
  // TLS to etcd (docs/fleet.md, Security): with a CA file every member is reached over https;
  // the client certificate and its key are set together, or neither.
  std::string fleet_etcd_ca_file;
  std::string fleet_etcd_cert_file;
  std::string fleet_etcd_key_file;
  // The programs a fleet rollout may make this node run besides the engine command's own
  // (controller/rollout/rollout_programs.h): absolute paths, a directory with a trailing '/'.
  std::vector<std::string> fleet_rollout_programs;
  // The first [fleet] key set other than etcd (config file or --fleet.key flag): refused
  // without fleet.etcd, where it would silently do nothing.
  std::string fleet_setting;
  // The node's key: <prefix>nodes/<node>.
  std::string fleet_key() const { return fleet_prefix + "nodes/" + fleet_node; }

  std::string socket_path() const { return runtime_dir + "/controller.sock"; }
  // Held (flock) by the controller of this runtime directory for as long as it runs.
  std::string lock_path() const { return runtime_dir + "/controller.lock"; }
  std::string journal_path() const { return state_dir + "/epoch.journal"; }
  std::string roster_path() const { return state_dir + "/roster.json"; }
  std::string memory_record_path() const { return state_dir + "/memory.json"; }
  std::string keeper_socket_path() const { return runtime_dir + "/keeper.sock"; }
};

// $BATON_RUNTIME_DIR, else /tmp/baton-<uid>.
std::string DefaultRuntimeDir();

// Parses TOML text; `source` names it in errors.
Result<ControllerConfig> ParseConfigToml(const std::string& text, const std::string& source);
// Reads and parses the file at `path`: a directory or anything else not a regular file is
// refused ("config file PATH: is a directory"), as is a file over kMaxConfigFileBytes
// (base/io/small_file.h).
Result<ControllerConfig> LoadConfigFile(const std::string& path);

// Applies flags (argv[1..]) over `config`: --config FILE is read first, then every other flag.
// Returns NotFound("help") for --help.
Status ParseControllerFlags(int argc, char** argv, ControllerConfig* config);

// Fills defaults (runtime_dir, state_dir) and checks cross-field rules.
Status FinishConfig(ControllerConfig* config);
// Its [fleet] part (config_fleet.cc): with etcd set, the node defaults to the host name and
// the model to the model directory's name; the prefix and the node must fit in a key; the TLS
// files must be readable, and https endpoints need the CA file; rollout_programs are absolute.
Status FinishFleetConfig(ControllerConfig* config);

// The usage text of baton-controller.
const char* ControllerUsage();

// Splits a command line on whitespace, honouring '...' and "..." quotes.
Result<std::vector<std::string>> SplitCommandLine(const std::string& line);

}  // namespace baton
