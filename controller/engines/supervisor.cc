#include "controller/engines/supervisor.h"

#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "proto/http/engine_key.h"

namespace baton {

std::string ExpandPlaceholders(const std::string& text,
                               const std::map<std::string, std::string>& values) {
  std::string out;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t open = text.find('{', pos);
    const size_t close = open == std::string::npos ? open : text.find('}', open);
    if (close == std::string::npos) break;
    auto it = values.find(text.substr(open + 1, close - open - 1));
    out += text.substr(pos, open - pos);
    out += it != values.end() ? it->second : text.substr(open, close - open + 1);
    pos = close + 1;
  }
  out += text.substr(pos);
  return out;
}

Supervisor::Supervisor(std::vector<std::string> command, std::string socket_path,
                       std::string model_dir, std::string runtime_dir, std::string log_dir)
    : command_(std::move(command)),
      socket_path_(std::move(socket_path)),
      model_dir_(std::move(model_dir)),
      runtime_dir_(std::move(runtime_dir)),
      log_dir_(std::move(log_dir)) {}

// Every name of EnginePlaceholders() (engine_placeholders.h), and only those.
std::map<std::string, std::string> Supervisor::Placeholders(const LaunchRequest& r) const {
  return {{"socket", socket_path_},          {"token", r.token},
          {"role", proto::ToString(r.role)}, {"engine_id", std::to_string(r.engine_id)},
          {"port", std::to_string(r.port)},  {"model_dir", model_dir_},
          {"runtime_dir", runtime_dir_},     {"host", host_}};
}

std::vector<std::string> Supervisor::Expand(const LaunchRequest& request) const {
  const auto values = Placeholders(request);
  std::vector<std::string> argv;
  const std::vector<std::string>& command = request.command.empty() ? command_ : request.command;
  for (const std::string& arg : command) argv.push_back(ExpandPlaceholders(arg, values));
  return argv;
}

Result<std::string> Supervisor::ProgramOf(const std::vector<std::string>& command) const {
  LaunchRequest request;
  request.command = command;
  const std::vector<std::string> argv = Expand(request);
  if (argv.empty()) return FailedPrecondition("the engine command is empty");
  Result<std::string> path = ResolveExecutable(argv[0]);
  if (!path.ok()) return FailedPrecondition(std::string(path.status().message()));
  return path;
}

Status Supervisor::CheckCommand(const std::vector<std::string>& command) const {
  Result<std::string> path = ProgramOf(command);
  if (!path.ok()) return path.status();
  struct stat st {};
  if (::stat(path->c_str(), &st) != 0) {
    return FailedPrecondition("engine program " + *path + ": " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode) || ::access(path->c_str(), X_OK) != 0) {
    return FailedPrecondition("engine program " + *path + " is not an executable file");
  }
  return OkStatus();
}

Result<ChildProcess> Supervisor::Launch(const LaunchRequest& request) const {
  std::map<std::string, std::string> env = extra_env_;
  env.insert({{"BATON_SOCKET", socket_path_},
              {"BATON_LAUNCH_TOKEN", request.token},
              {"BATON_ENGINE_ID", std::to_string(request.engine_id)},
              {"BATON_ROLE", proto::ToString(request.role)},
              {"BATON_HTTP_HOST", host_},
              {"BATON_HTTP_PORT", std::to_string(request.port)},
              {"BATON_MODEL_DIR", model_dir_}});
  // Set whether or not there are keys: one in the controller's own environment is not passed on.
  env[kEngineKeysEnv] = request.engine_keys;
  std::string log_path;
  if (!log_dir_.empty())
    log_path = log_dir_ + "/engine-" + std::to_string(request.engine_id) + ".log";
  return ChildProcess::Spawn(Expand(request), env, log_path, request.cgroup);
}

Result<std::string> Supervisor::NewToken() {
  uint8_t bytes[16];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = ::getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus("getrandom", errno);
    got += static_cast<size_t>(n);
  }
  static const char kHex[] = "0123456789abcdef";
  std::string token;
  for (uint8_t b : bytes) {
    token += kHex[b >> 4];
    token += kHex[b & 15];
  }
  return token;
}

}  // namespace baton
