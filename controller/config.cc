#include "controller/config.h"

#include <unistd.h>

#include <boost/asio/ip/address.hpp>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <sstream>
#include <toml.hpp>

#include "base/io/small_file.h"
#include "base/text/toml_depth.h"
#include "controller/config_values.h"
#include "controller/engines/engine_cgroup.h"
#include "controller/upgrade/command_record.h"
#include "cuda/driver/gpu_backend.h"
#include "proto/http/engine_key.h"

namespace baton {
namespace {

using config_values::Bool;
using config_values::Command;
using config_values::Endpoints;
using config_values::Int;
using config_values::Number;
using config_values::Setter;
using config_values::Size;
using config_values::Steps;
using config_values::Str;
using config_values::StringList;
using config_values::Time;
using config_values::U32;
using config_values::U64;

using Millis = std::chrono::milliseconds;
using Seconds = std::chrono::seconds;

// Every key, "section.key" -> setter.
std::map<std::string, Setter> Keys(ControllerConfig* c) {
  constexpr int64_t kDay = 86'400'000;
  return {
      {"controller.runtime_dir", Str(&c->runtime_dir)},
      {"controller.state_dir", Str(&c->state_dir)},
      {"controller.epoch_reserve", U64(&c->epoch_reserve, 1, 1 << 20)},
      {"controller.log_level", Str(&c->log_level)},
      {"controller.metrics_port", Int(&c->metrics_port, 0, 65535)},
      {"controller.metrics_host", Str(&c->metrics_host)},
      {"controller.name", Str(&c->name)},
      {"controller.router_socket", Str(&c->router_socket)},
      {"controller.readopt_timeout_ms", Time<Millis>(&c->readopt_timeout, 1, kDay)},
      {"controller.keep_memory", Bool(&c->keep_memory)},
      {"model.dir", Str(&c->model_dir)},
      {"model.numa_node", Int(&c->numa_node, -1, 1023)},
      {"model.huge_pages", Bool(&c->weights_huge_pages)},
      {"model.max_huge_pages", Int(&c->weights_max_huge_pages, -1, 1 << 30)},
      {"model.lock", Bool(&c->weights_lock)},
      {"engine.command", Command(&c->engine_command)},
      {"engine.log_dir", Str(&c->engine_log_dir)},
      {"engine.log_max_bytes", config_values::SizeOrZero(&c->engine_log_max_bytes)},
      {"engine.log_keep", Int(&c->engine_log_keep, 1, 100'000)},
      {"engine.crash_log_keep", Int(&c->engine_crash_log_keep, 0, 100'000)},
      {"engine.cgroup", Str(&c->engine_cgroup)},
      {"engine.host", Str(&c->engine_host)},
      {"engine.key_file", Str(&c->engine_key_file)},
      {"engine.base_port", Int(&c->base_port, 0, 65535)},
      {"engine.port_count", Int(&c->port_count, 1, 1024)},
      {"engine.register_timeout_ms", Time<Millis>(&c->register_timeout, 100, kDay)},
      {"engine.promote_timeout_ms", Time<Millis>(&c->promote_timeout, 10, kDay)},
      {"engine.drain_timeout_ms", Time<Millis>(&c->drain_timeout, 0, kDay)},
      {"engine.stop_grace_ms", Time<Millis>(&c->stop_grace, 0, kDay)},
      {"engine.controller_absent_timeout_ms", Time<Millis>(&c->controller_absent_timeout, 0, kDay)},
      {"engine.on_controller_absent", Str(&c->on_controller_absent)},
      {"pool.blocks", U32(&c->block_count, 1, 1 << 24)},
      {"pool.block_bytes", Size(&c->block_bytes)},
      {"pool.huge_pages", Bool(&c->pool_huge_pages)},
      {"pool.initial_grant_blocks", U32(&c->initial_grant_blocks, 0, 1 << 24)},
      {"pool.promotion_reserve_blocks", Int(&c->promotion_reserve_blocks, 0, 1 << 24)},
      {"gpu.backend",
       [c](const toml::value& v) -> Status {  // checked here, so the error names the file
         BATON_RETURN_IF_ERROR(Str(&c->gpu_backend)(v));
         return ParseBackendMode(c->gpu_backend).status();
       }},
      {"gpu.device", Int(&c->gpu_device, 0, 1023)},
      {"gpu.release_timeout_ms", Time<Millis>(&c->gpu_release_timeout, 1, kDay)},
      {"gpu.probe_interval_ms", Time<Millis>(&c->gpu_probe_interval, 0, kDay)},
      {"gpu.pool_chunk_bytes", Size(&c->gpu_pool_chunk_bytes)},
      {"health.heartbeat_interval_ms", Time<Millis>(&c->heartbeat_interval, 1, 60'000)},
      {"health.heartbeat_misses", Int(&c->heartbeat_misses, 1, 1000)},
      {"health.probe_timeout_ms", Time<Millis>(&c->probe_timeout, 1, 60'000)},
      {"health.compute_stall_timeout_ms", Time<Millis>(&c->compute_stall_timeout, 0, kDay)},
      {"policy.max_failures", Int(&c->crash.max_failures, 1, 1'000'000)},
      {"policy.failure_window_s", Time<Seconds>(&c->crash.window, 1, kDay)},
      {"policy.initial_backoff_ms", Time<Millis>(&c->crash.initial_backoff, 1, kDay)},
      {"policy.max_backoff_ms", Time<Millis>(&c->crash.max_backoff, 1, kDay)},
      {"policy.quiet_period_s", Time<Seconds>(&c->crash.quiet_period, 1, kDay)},
      {"policy.standby_relaunch_delay_ms", Time<Millis>(&c->standby_relaunch_delay, 0, 60'000)},
      {"upgrade.steps", Steps(&c->canary.steps)},
      {"upgrade.step_duration_ms", Time<Millis>(&c->canary.step_duration, 0, kDay)},
      {"upgrade.min_requests", U64(&c->canary.min_requests, 1, 1'000'000'000)},
      {"upgrade.max_error_rate_excess", Number(&c->canary.max_error_rate_excess, 0, 1)},
      {"upgrade.max_latency_ratio", Number(&c->canary.max_latency_ratio, 1, 1000)},
      {"upgrade.latency_warmup_requests",
       U64(&c->canary.latency_warmup_requests, 0, 1'000'000'000)},
      {"upgrade.max_disagreement_rate", Number(&c->canary.max_disagreement_rate, 0, 1)},
      {"fleet.etcd", Endpoints(&c->fleet_etcd)},
      {"fleet.prefix", Str(&c->fleet_prefix)},
      {"fleet.node", Str(&c->fleet_node)},
      {"fleet.model", Str(&c->fleet_model)},
      {"fleet.lease_ttl_ms", Time<Millis>(&c->fleet_lease_ttl, 1000, 3'600'000)},
      {"fleet.etcd_timeout_ms", Time<Millis>(&c->fleet_etcd_timeout, 10, 60'000)},
      {"fleet.etcd_ca_file", Str(&c->fleet_etcd_ca_file)},
      {"fleet.etcd_cert_file", Str(&c->fleet_etcd_cert_file)},
      {"fleet.etcd_key_file", Str(&c->fleet_etcd_key_file)},
      {"fleet.rollout_programs", StringList(&c->fleet_rollout_programs)},
  };
}

Status ApplyTable(const toml::value& root, const std::string& source, ControllerConfig* c) {
  if (!root.is_table()) return InvalidArgument(source + ": not a TOML table");
  const std::map<std::string, Setter> keys = Keys(c);
  for (const auto& [section, body] : root.as_table()) {
    if (!body.is_table()) {
      return InvalidArgument(
          source + ": '" + section + "' must be a [section] (one of " +
          "controller, model, engine, pool, gpu, health, policy, upgrade, fleet)");
    }
    for (const auto& [key, value] : body.as_table()) {
      const std::string name = section + "." + key;
      auto it = keys.find(name);
      if (it == keys.end()) return InvalidArgument(source + ": unknown key '" + name + "'");
      Status set = it->second(value);
      if (!set.ok()) return InvalidArgument(source + ": " + name + ": " + set.message());
      if (section == "fleet" && key != "etcd" && c->fleet_setting.empty()) c->fleet_setting = name;
    }
  }
  return OkStatus();
}

// Flag name -> key. Every key is also accepted as --section.key.
const std::map<std::string, std::string>& FlagAliases() {
  static const auto* aliases = new std::map<std::string, std::string>{
      {"model", "model.dir"},
      {"engine-cmd", "engine.command"},
      {"runtime-dir", "controller.runtime_dir"},
      {"state-dir", "controller.state_dir"},
      {"log-level", "controller.log_level"},
      {"metrics-port", "controller.metrics_port"},
      {"numa-node", "model.numa_node"},
      {"pool-blocks", "pool.blocks"},
      {"block-bytes", "pool.block_bytes"},
      {"heartbeat-ms", "health.heartbeat_interval_ms"},
      {"heartbeat-misses", "health.heartbeat_misses"},
      {"base-port", "engine.base_port"},
      {"engine-log-dir", "engine.log_dir"},
      {"max-failures", "policy.max_failures"},
      {"gpu-backend", "gpu.backend"},
      {"gpu-device", "gpu.device"},
  };
  return *aliases;
}

// A flag's text as a TOML value: an integer or boolean when it reads as one, else a string.
toml::value FlagValue(const std::string& text) {
  if (text == "true") return toml::value(true);
  if (text == "false") return toml::value(false);
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(text.c_str(), &end, 10);
  if (!text.empty() && *end == '\0' && errno == 0) return toml::value(static_cast<int64_t>(n));
  return toml::value(text);
}

Status UnknownFlag(const std::string& name) {
  return InvalidArgument("unknown flag --" + name + " (see --help)");
}

// Whether --`name` VALUE is a flag: --config, a shortcut, or a key.
bool TakesValue(const std::string& name) {
  if (name == "config" || FlagAliases().count(name) != 0) return true;
  ControllerConfig unused;
  return Keys(&unused).count(name) != 0;
}

Status ApplyFlag(const std::string& name, const std::string& text, ControllerConfig* c) {
  std::string key = name;
  if (auto it = FlagAliases().find(name); it != FlagAliases().end()) key = it->second;
  const std::map<std::string, Setter> keys = Keys(c);
  auto it = keys.find(key);
  if (it == keys.end()) return UnknownFlag(name);
  const toml::value typed = FlagValue(text);
  Status set = it->second(typed);
  // A string key given a value that reads as a number or boolean (--controller.name=42).
  if (!set.ok() && !typed.is_string()) {
    if (Status as_text = it->second(toml::value(text)); as_text.ok()) return OkStatus();
  }
  if (!set.ok()) return InvalidArgument("--" + name + ": " + set.message());
  if (key.rfind("fleet.", 0) == 0 && key != "fleet.etcd" && c->fleet_setting.empty()) {
    c->fleet_setting = "--" + name;
  }
  return OkStatus();
}

// What a start would refuse only once it got there (exit 1, restarted in a loop by systemd):
// checked with the rest of the config, exit 2.
Status CheckStartSettings(const ControllerConfig& c) {
  boost::system::error_code ec;
  (void)boost::asio::ip::make_address(c.metrics_host, ec);  // as the metrics server binds it
  if (ec && c.metrics_port != 0) {                          // without a port it is not bound
    return InvalidArgument("controller.metrics_host: want an IP address, got \"" + c.metrics_host +
                           "\"");
  }
  return EngineCgroups::CheckSetting(c.engine_cgroup);
}

}  // namespace

std::string DefaultRuntimeDir() {
  if (const char* dir = std::getenv("BATON_RUNTIME_DIR"); dir != nullptr && *dir != '\0') {
    return dir;
  }
  return "/tmp/baton-" + std::to_string(::getuid());
}

Result<ControllerConfig> ParseConfigToml(const std::string& text, const std::string& source) {
  ControllerConfig config;
  try {
    BATON_RETURN_IF_ERROR(CheckTomlDepth(text, source));
    std::istringstream in(text);
    const toml::value root = toml::parse(in, source);
    BATON_RETURN_IF_ERROR(ApplyTable(root, source, &config));
  } catch (const std::exception& e) {
    return InvalidArgument(std::string("malformed TOML: ") + e.what());
  }
  return config;
}

Result<ControllerConfig> LoadConfigFile(const std::string& path) {
  Result<std::string> text = ReadRegularFile(path, kMaxConfigFileBytes);
  if (!text.ok()) return Status(text.status().code(), "config file " + text.status().message());
  return ParseConfigToml(*text, path);
}

Status ParseControllerFlags(int argc, char** argv, ControllerConfig* config) {
  std::vector<std::pair<std::string, std::string>> flags;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") return NotFound("help");
    if (arg.rfind("--", 0) != 0) return InvalidArgument("unexpected argument '" + arg + "'");
    arg = arg.substr(2);
    std::string value;
    if (const size_t eq = arg.find('='); eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      if (arg == "no-huge-pages") return InvalidArgument("--no-huge-pages takes no value");
    } else if (arg == "no-huge-pages") {
      flags.emplace_back("model.huge_pages", "false");
      flags.emplace_back("pool.huge_pages", "false");
      continue;
    } else {
      // Named before a value is looked for: a mistyped --no-huge-pages is no flag that
      // needs one.
      if (!TakesValue(arg)) return UnknownFlag(arg);
      if (i + 1 >= argc) return InvalidArgument("--" + arg + " needs a value");
      value = argv[++i];
    }
    if (arg == "config") {
      BATON_ASSIGN_OR_RETURN(*config, LoadConfigFile(value));
      continue;
    }
    flags.emplace_back(arg, value);
  }
  for (const auto& [name, value] : flags) BATON_RETURN_IF_ERROR(ApplyFlag(name, value, config));
  return OkStatus();
}

Status FinishConfig(ControllerConfig* c) {
  if (c->runtime_dir.empty()) c->runtime_dir = DefaultRuntimeDir();
  if (c->state_dir.empty()) c->state_dir = c->runtime_dir + "/state";
  if (c->model_dir.empty()) return InvalidArgument("model.dir (--model) is required");
  if (c->engine_command.empty()) {
    return InvalidArgument("engine.command (--engine-cmd) is required");
  }
  BATON_RETURN_IF_ERROR(CheckRecordableCommand(c->engine_command, "engine.command"));
  if (c->block_bytes % 4096 != 0) {
    return InvalidArgument("pool.block_bytes: must be a multiple of 4096, got " +
                           std::to_string(c->block_bytes));
  }
  if (c->gpu_pool_chunk_bytes == 0) {
    return InvalidArgument("gpu.pool_chunk_bytes: must be positive (the most a chunk holds)");
  }
  if (c->initial_grant_blocks > c->block_count) {
    return InvalidArgument("pool.initial_grant_blocks " + std::to_string(c->initial_grant_blocks) +
                           " exceeds pool.blocks " + std::to_string(c->block_count));
  }
  if (c->socket_path().size() > 107) {
    return InvalidArgument("controller.runtime_dir is too long for a Unix socket path: " +
                           c->socket_path());
  }
  const auto same_path = [](const std::string& a, const std::string& b) {
    return std::filesystem::path(a).lexically_normal() ==
           std::filesystem::path(b).lexically_normal();
  };
  if (!c->router_socket.empty() &&
      (c->router_socket.front() != '/' || c->router_socket.size() > 107 ||
       same_path(c->router_socket, c->socket_path()) ||
       same_path(c->router_socket, c->keeper_socket_path()))) {
    return InvalidArgument(
        "controller.router_socket: want an absolute path of at most 107 bytes other than "
        "controller.sock and keeper.sock, got \"" +
        c->router_socket + "\"");
  }
  if (Result<BackendMode> mode = ParseBackendMode(c->gpu_backend); !mode.ok()) {
    return InvalidArgument("gpu.backend: " + mode.status().message());
  }
  if (c->crash.max_backoff < c->crash.initial_backoff) {
    return InvalidArgument("policy.max_backoff_ms is below policy.initial_backoff_ms");
  }
  if (c->engine_host.empty() || c->engine_host.find_first_of(" \t/") != std::string::npos) {
    return InvalidArgument("engine.host: want a host name or address engines listen on, got \"" +
                           c->engine_host + "\"");
  }
  if (!c->engine_key_file.empty()) {
    BATON_RETURN_IF_ERROR(CheckEngineKeyFileSetting("engine.key_file", c->engine_key_file));
  }
  if (c->base_port != 0 && c->base_port + c->port_count - 1 > 65535) {
    return InvalidArgument("engine.base_port " + std::to_string(c->base_port) + " + port_count " +
                           std::to_string(c->port_count) + " runs past port 65535");
  }
  if (c->on_controller_absent != "serve" && c->on_controller_absent != "stop") {
    return InvalidArgument("engine.on_controller_absent: \"serve\" or \"stop\", got \"" +
                           c->on_controller_absent + "\"");
  }
  BATON_RETURN_IF_ERROR(CheckStartSettings(*c));
  return FinishFleetConfig(c);
}

Result<std::vector<std::string>> SplitCommandLine(const std::string& line) {
  std::vector<std::string> out;
  std::string cur;
  bool in_word = false;
  char quote = 0;
  for (char ch : line) {
    if (quote != 0) {
      if (ch == quote) {
        quote = 0;
      } else {
        cur += ch;
      }
    } else if (ch == '\'' || ch == '"') {
      quote = ch;
      in_word = true;
    } else if (std::isspace(static_cast<unsigned char>(ch))) {
      if (in_word) out.push_back(std::move(cur));
      cur.clear();
      in_word = false;
    } else {
      cur += ch;
      in_word = true;
    }
  }
  if (quote != 0) return InvalidArgument("unterminated quote in command line: " + line);
  if (in_word) out.push_back(std::move(cur));
  if (out.empty()) return InvalidArgument("empty command line");
  return out;
}

const char* ControllerUsage() {
  return R"(usage: baton-controller [--config FILE] [flags]
       baton-controller --check-config [--config FILE] [flags]
       baton-controller --version

Owns the model weights and the KV-cache pool, runs a primary and a standby engine, and
promotes the standby when the primary dies, hangs or reports an error.

flags (each overrides the config file; every config key is also --section.key=VALUE):
  --config FILE          TOML config (see docs/operations.md)
  --check-config         check the config and flags, print where they lead, and exit: 0 when
                         valid, 2 naming the key that is not (model.dir too, when its
                         weights would not load)
  --model DIR            model directory (config.json + safetensors)          [model.dir]
  --engine-cmd "CMD"     engine command line; placeholders {socket} {token} {role}
                         {engine_id} {host} {port} {model_dir} {runtime_dir}  [engine.command]
  --runtime-dir DIR      socket directory (default $BATON_RUNTIME_DIR or /tmp/baton-<uid>)
  --state-dir DIR        epoch journal directory (default <runtime-dir>/state)
  --numa-node N          NUMA node of the weights (-1: automatic)
  --pool-blocks N        KV-cache pool blocks                                 [pool.blocks]
  --block-bytes SIZE     bytes per block, e.g. 2MiB                           [pool.block_bytes]
  --heartbeat-ms N       engine heartbeat interval (default 100)
  --heartbeat-misses N   missed heartbeats before a health probe (default 3)
  --base-port N          first {port} handed to engines (0: none)
  --engine-log-dir DIR   each engine's stdout and stderr in DIR/engine-<id>.log  [engine.log_dir]
  --max-failures N       crash-loop threshold within policy.failure_window_s
  --metrics-port N       serve Prometheus /metrics on this port (0: off)
  --no-huge-pages        use normal pages for weights and pool
  --gpu-backend MODE     auto | host | cuda: memory backend (default auto)     [gpu.backend]
  --gpu-device N         CUDA device ordinal (default 0)                      [gpu.device]
  --log-level LEVEL      debug | info | warn | error
)";
}

}  // namespace baton
