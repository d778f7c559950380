// baton-controller: the node-local daemon. See controller/controller.h and
// docs/operations.md. Exit status: 0 after SIGINT/SIGTERM (and for --help, --version and a
// good --check-config), 1 when it cannot start, 2 on a bad config or flag (and from
// --check-config, on a model.dir a start could not load).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/signal_set.hpp>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/build_info.h"
#include "base/io/fd_limit.h"
#include "base/io/sd_notify.h"
#include "base/io/service_watchdog.h"
#include "base/log.h"
#include "controller/config.h"
#include "controller/controller.h"
#include "controller/ctl/ctl_service.h"
#include "controller/ctl/degradations.h"
#include "controller/ctl/metrics_server.h"
#include "controller/engines/engine_placeholders.h"
#include "controller/engines/supervisor.h"
#include "cuda/driver/gpu_backend.h"
#include "fleet/plaintext_etcd.h"
#include "weightcache/io/numa.h"
#include "weightcache/model_files.h"

namespace baton {
namespace {

constexpr char kProgram[] = "baton-controller";

// Removes every `flag` from argv; true when there was one.
bool TakeFlag(std::vector<char*>* args, const char* flag) {
  const auto before = args->size();
  std::erase_if(*args, [flag](const char* a) { return std::strcmp(a, flag) == 0; });
  return args->size() != before;
}

// Why engines, which read model.dir's config.json, would not start on it; "" when they would
// as far as JSON goes (each engine checks its own fields).
std::string ModelConfigProblem(const std::string& model_dir) {
  const std::string path = model_dir + "/config.json";
  if (::access(path.c_str(), R_OK) != 0) {
    return "model.dir has no readable config.json here: the weights would load, but no engine "
           "would start (engines read the model config)";
  }
  try {
    std::ifstream in(path, std::ios::binary);
    [[maybe_unused]] const nlohmann::json parsed = nlohmann::json::parse(in);
    return "";
  } catch (const nlohmann::json::exception& e) {
    return "model.dir's config.json is not valid JSON (" + std::string(e.what()) +
           "): the weights would load, but no engine would start";
  }
}

// Whether the engine program would run here, as a launch runs it: the placeholders expanded
// first ({runtime_dir}/engine), then resolved against PATH (controller/engines/supervisor.h).
Status CheckEngineProgram(const ControllerConfig& c) {
  Supervisor supervisor(c.engine_command, c.socket_path(), c.model_dir, c.runtime_dir,
                        c.engine_log_dir);
  supervisor.SetHost(c.engine_host);
  return supervisor.CheckCommand({});
}

// model.numa_node where a start would bind the weights (weightcache/io/pinned_arena.cc): a node
// that is not online on this machine is a config error here, named, not a start's exit 1.
Status CheckNumaNode(const ControllerConfig& c) {
  if (c.numa_node < 0) return OkStatus();  // automatic
  const std::vector<int> online = OnlineNumaNodes();
  if (std::find(online.begin(), online.end(), c.numa_node) != online.end()) return OkStatus();
  std::string nodes;
  for (const int n : online) nodes += (nodes.empty() ? "" : ",") + std::to_string(n);
  return InvalidArgument("model.numa_node: node " + std::to_string(c.numa_node) +
                         " is not online here (online nodes: " + nodes + ")");
}

// What --check-config prints for a config that parses: the places it resolves to, and what
// would stop a start (exit 1 at run time, not a config error) as warnings. A model.dir whose
// weights a start could not load is an error, as a bad key is: exit 2.
int ReportCheckedConfig(const ControllerConfig& c) {
  // The same check as the start's first step (WeightCache::Load), headers only.
  if (Result<ModelFiles> model = ModelFiles::Open(c.model_dir); !model.ok()) {
    std::fprintf(stderr, "%s: model.dir: %s: the controller would not start\n", kProgram,
                 model.status().message().c_str());
    return 2;
  }
  std::printf("%s: the configuration is valid\n", kProgram);
  std::printf("  runtime_dir %s (socket %s)\n  state_dir   %s\n  model.dir   %s\n",
              c.runtime_dir.c_str(), c.socket_path().c_str(), c.state_dir.c_str(),
              c.model_dir.c_str());
  std::printf("  engine      %s\n", c.engine_command.front().c_str());
  if (!c.engine_key_file.empty()) {
    std::printf("  engine key  %s: engines serve only the requests that carry one\n",
                c.engine_key_file.c_str());
  }
  if (!c.fleet_etcd.empty()) {
    std::string members;
    for (const std::string& m : c.fleet_etcd) members += (members.empty() ? "" : ", ") + m;
    std::printf("  fleet       node %s, key %s, model %s; etcd %s%s\n", c.fleet_node.c_str(),
                c.fleet_key().c_str(), c.fleet_model.c_str(), members.c_str(),
                c.fleet_etcd_ca_file.empty() ? "" : " (TLS)");
  }
  auto warn = [](const std::string& what) { std::printf("  warning: %s\n", what.c_str()); };
  if (std::string problem = ModelConfigProblem(c.model_dir); !problem.empty()) warn(problem);
  if (Status program = CheckEngineProgram(c); !program.ok()) {
    warn("engine.command: " + program.message() + ": no engine would start");
  }
  if (c.metrics_port == 0) warn("controller.metrics_port is 0: no /metrics to scrape");
  if (c.engine_key_file.empty() && !IsLoopbackHost(c.engine_host)) {
    warn(EnginesOpenWarning(c.engine_host));
  }
  if (Status p = CheckPlaceholders(c.engine_command, "engine.command"); !p.ok()) {
    warn(p.message() + ": passed to the engine as written");
  }
  // The GPU part as a start would find it (the driver loaded, the device there).
  if (Result<BackendMode> mode = ParseBackendMode(c.gpu_backend); mode.ok()) {
    Result<BackendChoice> backend =
        ChooseMemoryBackend(BackendOptions{.mode = *mode, .device = c.gpu_device});
    if (!backend.ok()) {
      warn("gpu: " + backend.status().message() + ": the controller would not start");
    } else {
      std::printf("  gpu         %s\n", backend->LogLine().c_str());
    }
  }
  return 0;
}

// Past the Controller's end a signal has nothing left to stop, and one that landed once
// `signals` let go of SIGINT and SIGTERM (asio restores their default action) would turn this
// exit 0 into a kill: they are ignored instead, blocked meanwhile so that none lands in between
// (this thread is the last; a pending one is dropped once ignored).
void IgnoreStopSignals(boost::asio::signal_set* signals) {
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  sigset_t before;
  ::pthread_sigmask(SIG_BLOCK, &stop, &before);
  boost::system::error_code ignored;
  signals->clear(ignored);
  ::signal(SIGINT, SIG_IGN);
  ::signal(SIGTERM, SIG_IGN);
  ::pthread_sigmask(SIG_SETMASK, &before, nullptr);
}

int Run(int argc, char** argv) {
  if (WantsVersion(argc, argv)) {
    std::printf("%s\n", VersionLine(kProgram).c_str());
    return 0;
  }
  std::vector<char*> args(argv, argv + argc);
  const bool check_only = TakeFlag(&args, "--check-config");
  ControllerConfig config;
  Status parsed = ParseControllerFlags(static_cast<int>(args.size()), args.data(), &config);
  if (parsed.code() == StatusCode::kNotFound && parsed.message() == "help") {
    std::fputs(ControllerUsage(), stdout);
    return 0;
  }
  if (parsed.ok()) parsed = FinishConfig(&config);
  if (parsed.ok()) parsed = CheckNumaNode(config);
  LogLevel level;
  if (parsed.ok() && !ParseLogLevel(config.log_level, &level)) {
    parsed = InvalidArgument("controller.log_level: unknown level '" + config.log_level +
                             "' (debug, info, warn or error)");
  }
  if (!parsed.ok()) {
    std::fprintf(stderr, "%s: %s\n", kProgram, parsed.message().c_str());
    if (!check_only) std::fprintf(stderr, "\n%s", ControllerUsage());
    return 2;
  }
  if (check_only) return ReportCheckedConfig(config);
  // Before any thread starts: the service manager's variables leave the environment, so that
  // engines and baton-keeper do not inherit them.
  SdNotifier notifier = SdNotifier::FromEnvironment();
  if (!EnvironmentLogLevel().has_value()) SetLogLevel(level);  // an unknown one: as if unset
  ::signal(SIGPIPE, SIG_IGN);                                  // engines reset it before exec
  RaiseFdLimit();  // the CUDA backend holds one fd per adopted device memory chunk
  BATON_LOG(INFO, "controller") << VersionLine(kProgram) << ", pid " << ::getpid();
  // Not refused here (an awk script's {print} may be meant), unlike an upgrade's command.
  if (Status p = CheckPlaceholders(config.engine_command, "engine.command"); !p.ok()) {
    BATON_LOG(WARN, "controller") << p.message() << ": passed to the engine as written";
  }

  boost::asio::io_context io;
  ServiceWatchdog watchdog(io, std::move(notifier), RealClock::Get(), "controller");
  // The metrics port is bound before the controller starts baton-keeper or re-adopts a
  // running pair: a port another process holds is then an exit that started nothing and,
  // after a restart, took nothing of the pair down with it. It answers once io runs, when
  // the controller exists.
  Controller* c = nullptr;
  std::unique_ptr<MetricsServer> metrics;
  if (config.metrics_port != 0) {
    auto started =
        MetricsServer::Start(io, config.metrics_host, config.metrics_port, [&c, &watchdog] {
          if (c == nullptr) return std::string();
          return MetricsText(c->Snapshot()) + watchdog.Metrics() + ProcessInfoMetrics(kProgram);
        });
    if (!started.ok()) {
      BATON_LOG(ERROR, "controller") << "cannot start: " << started.status().ToString();
      return 1;
    }
    metrics = std::move(started).value();
  }
  Result<std::unique_ptr<Controller>> controller = Controller::Create(io, config, RealClock::Get());
  if (!controller.ok()) {
    BATON_LOG(ERROR, "controller") << "cannot start: " << controller.status().ToString();
    return 1;
  }
  c = controller->get();
  boost::asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&](const boost::system::error_code& ec, int sig) {
    if (ec) return;
    BATON_LOG(INFO, "controller") << "signal " << sig << ": shutting down";
    watchdog.Stopping();
    metrics.reset();
    c->Shutdown([&io] { io.stop(); });
  });
  c->Start();
  watchdog.Start("serving its socket");
  io.run();
  // The Controller goes while `signals` still holds SIGINT and SIGTERM: a second signal (a
  // script's cleanup after its Ctrl-C) must not kill it, with their default action, before
  // its destructor has removed the engine cgroups and their base.
  c = nullptr;
  controller->reset();
  IgnoreStopSignals(&signals);
  BATON_LOG(INFO, "controller") << "stopped";
  return 0;
}

}  // namespace
}  // namespace baton

int main(int argc, char** argv) { return baton::Run(argc, argv); }
