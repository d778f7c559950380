// Supervisor: how the controller launches an engine, as a ChildProcess (child_process.h).
//
// Supervisor expands the configured engine command line ({socket} {token} {role}
// {engine_id} {host} {port} {model_dir} {runtime_dir}), puts the same values in the
// environment (BATON_SOCKET, BATON_LAUNCH_TOKEN, BATON_ENGINE_ID, BATON_ROLE, BATON_HTTP_HOST,
// BATON_HTTP_PORT, BATON_MODEL_DIR, BATON_ENGINE_KEYS (empty without keys), and what
// SetEngineEnvironment adds), and spawns it
// (ChildProcess::Spawn). Its stdout/stderr go to <log_dir>/engine-<id>.log when a log
// directory is configured. Launch tokens are 128 random bits from getrandom().
//
// Thread: io_context thread only (Launch forks there).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "base/status.h"
#include "controller/engines/child_process.h"
#include "controller/engines/spawn_cgroup.h"
#include "proto/roles.h"

namespace baton {

struct LaunchRequest {
  uint64_t engine_id = 0;
  proto::LaunchRole role = proto::LaunchRole::kStandby;
  std::string token;  // launch token checked in Hello
  int port = 0;
  // The command line to expand instead of the configured one (an upgrade's candidate);
  // empty: the configured command.
  std::vector<std::string> command = {};
  SpawnCgroup cgroup = {};       // the engine's cgroup (EngineCgroup::spawn_target), or none
  std::string engine_keys = {};  // BATON_ENGINE_KEYS (EngineKeyFile::ForLaunch); "": none
};

class Supervisor {
 public:
  Supervisor(std::vector<std::string> command, std::string socket_path, std::string model_dir,
             std::string runtime_dir, std::string log_dir);

  Result<ChildProcess> Launch(const LaunchRequest& request) const;
  // More variables for every engine's environment (the absent-controller policy).
  void SetEngineEnvironment(std::map<std::string, std::string> env) { extra_env_ = std::move(env); }
  // The address engines listen on and announce ({host}, engine.host).
  void SetHost(std::string host) { host_ = std::move(host); }

  // The command line `Launch` would run.
  std::vector<std::string> Expand(const LaunchRequest& request) const;
  // The program `command` (empty: the configured one) would run: its first word with the
  // placeholders expanded, resolved against PATH as Launch resolves it. FailedPrecondition
  // when it is empty or not found.
  Result<std::string> ProgramOf(const std::vector<std::string>& command) const;
  // Whether `command` (empty: the configured one) could be launched: its program, with the
  // placeholders expanded and resolved against PATH as Launch resolves it, is an executable
  // file. FailedPrecondition naming the program and why not.
  Status CheckCommand(const std::vector<std::string>& command) const;

  // 32 hex digits from getrandom().
  static Result<std::string> NewToken();

 private:
  std::map<std::string, std::string> Placeholders(const LaunchRequest& request) const;

  std::vector<std::string> command_;
  std::string socket_path_;
  std::string model_dir_;
  std::string runtime_dir_;
  std::string log_dir_;
  std::string host_ = "127.0.0.1";
  std::map<std::string, std::string> extra_env_;
};

// Replaces each {name} in `text` by values.at(name); unknown {names} are kept as they are.
std::string ExpandPlaceholders(const std::string& text,
                               const std::map<std::string, std::string>& values);

}  // namespace baton
