#include "perf/load/load_procs.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <thread>

#include "base/clock.h"
#include "perf/load/load_client.h"
#include "standby/mkmodel/model_presets.h"

namespace baton::perf {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

constexpr auto kPoll = milliseconds(20);

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

Result<ModelSummary> EnsureTinyModel(const std::string& dir) {
  BATON_ASSIGN_OR_RETURN(ModelSpec spec, ParsePreset("tiny", DType::kF32));
  spec.seed = 1;
  WriteOptions options;
  options.reuse = true;
  return WriteModel(spec, dir, options);
}

Status WaitForHttpStatus(const std::string& address, std::string_view path, int want_status,
                         milliseconds limit, ServingProcess* process) {
  const auto deadline = RealClock::Get().Now() + limit;
  std::string last = "no answer";
  while (RealClock::Get().Now() < deadline) {
    if (process != nullptr && !process->process.Running()) {
      return Unavailable("the process exited before answering " + std::string(path) + " on " +
                         address + "; see " + process->log);
    }
    LoadClient client(address, milliseconds(2000));
    LoadReply r = client.Get(path);
    if (r.status == want_status) return OkStatus();
    last = r.status != 0 ? "HTTP " + std::to_string(r.status) : r.error;
    std::this_thread::sleep_for(kPoll);
  }
  return DeadlineExceeded(address + std::string(path) + " did not answer " +
                          std::to_string(want_status) + " within " + std::to_string(limit.count()) +
                          " ms (last: " + last + ")" +
                          (process != nullptr ? "; see " + process->log : ""));
}

Result<ServingProcess> StartStandaloneEngine(const std::string& bin_dir,
                                             const std::string& model_dir,
                                             const std::string& served_name,
                                             const std::string& work_dir,
                                             const std::vector<std::string>& extra_args) {
  const std::string port_file = work_dir + "/engine.port";
  ::unlink(port_file.c_str());
  std::vector<std::string> argv = {
      bin_dir + "/baton-refengine", "--model",  model_dir, "--port", "0", "--port-file", port_file,
      "--served-model-name",        served_name};
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  const std::string log = work_dir + "/engine.log";
  BATON_ASSIGN_OR_RETURN(ChildProcess child, ChildProcess::Spawn(argv, log));
  ServingProcess engine{std::move(child), "", log};
  BATON_ASSIGN_OR_RETURN(
      const uint16_t port,
      WaitForPortFile(port_file, engine.process, std::chrono::seconds(120), kPoll, log));
  engine.address = "127.0.0.1:" + std::to_string(port);
  BATON_RETURN_IF_ERROR(
      WaitForHttpStatus(engine.address, "/health", 200, milliseconds(60000), &engine));
  return engine;
}

Result<ServingProcess> StartRouterProcess(const std::string& bin_dir,
                                          const std::vector<std::string>& args,
                                          const std::string& log) {
  Status last = OkStatus();
  for (int attempt = 0; attempt < 3; ++attempt) {  // a free port can be taken before the bind
    const uint16_t port = FreeLoopbackPort();
    if (port == 0) return Unavailable("no free loopback port");
    std::vector<std::string> argv = {bin_dir + "/baton-router", "--listen",
                                     "127.0.0.1:" + std::to_string(port)};
    argv.insert(argv.end(), args.begin(), args.end());
    BATON_ASSIGN_OR_RETURN(ChildProcess child, ChildProcess::Spawn(argv, log));
    ServingProcess router{std::move(child), "127.0.0.1:" + std::to_string(port), log};
    last = WaitForHttpStatus(router.address, "/health", 200, milliseconds(30000), &router);
    if (last.ok()) return router;
    if (router.process.Running()) return last;  // up, but no primary: not a port clash
  }
  return last;
}

Result<ControllerPair> ControllerPair::Start(const std::string& bin_dir,
                                             const std::string& model_dir,
                                             const std::string& work_dir,
                                             const PairConfig& config) {
  const std::string engines = work_dir + "/engines";
  if (::mkdir(engines.c_str(), 0755) != 0 && errno != EEXIST) {
    return ErrnoStatus("mkdir " + engines, errno);
  }
  const std::string toml = work_dir + "/controller.toml";
  std::ofstream out(toml);
  out << "[controller]\nruntime_dir = " << Quote(work_dir) << "\n\n"
      << "[model]\ndir = " << Quote(model_dir) << "\nlock = false\n\n"
      << "[engine]\ncommand = [" << Quote(bin_dir + "/baton-refengine")
      << ", \"--model\", \"{model_dir}\", \"--port\", \"{port}\", \"--controller\", "
         "\"{socket}\", \"--token\", \"{token}\", \"--role\", \"{role}\", \"--engine-id\", "
         "\"{engine_id}\", \"--threads\", \""
      << config.engine_threads << "\", \"--served-model-name\", " << Quote(config.served_name);
  for (const std::string& arg : config.engine_args) out << ", " << Quote(arg);
  out << "]\nlog_dir = " << Quote(engines) << "\nbase_port = 0\n\n"
      << "[pool]\nblocks = " << config.pool_blocks << "\nblock_bytes = " << config.block_bytes
      << "\n\n[policy]\nmax_failures = 1000\n"
      << config.extra_toml;
  out.close();
  if (!out) return ErrnoStatus("write " + toml, errno);
  const std::string log = work_dir + "/controller.log";
  BATON_ASSIGN_OR_RETURN(
      ChildProcess child,
      ChildProcess::Spawn({bin_dir + "/baton-controller", "--config", toml}, log));
  ControllerPair pair(std::move(child), bin_dir, work_dir + "/controller.sock", log, toml);
  BATON_RETURN_IF_ERROR(pair.WaitReady(milliseconds(120000)).status());
  return pair;
}

void ControllerPair::Kill() {
  if (!controller_.has_value()) return;
  ::kill(controller_->pid(), SIGKILL);
  controller_.reset();  // reaps it
}

Status ControllerPair::Respawn() {
  Kill();
  BATON_ASSIGN_OR_RETURN(
      ChildProcess child,
      ChildProcess::Spawn({bin_dir_ + "/baton-controller", "--config", config_}, log_));
  controller_.emplace(std::move(child));
  return OkStatus();
}

Result<json> ControllerPair::Ctl(const std::vector<std::string>& args) const {
  return BatonctlJson(bin_dir_ + "/batonctl", socket_, args);
}

Result<json> ControllerPair::WaitReady(milliseconds limit) {
  const auto deadline = RealClock::Get().Now() + limit;
  std::string last = "no answer";
  while (RealClock::Get().Now() < deadline) {
    if (!controller_.has_value() || !controller_->Running()) {
      return Unavailable("baton-controller exited; see " + log_);
    }
    Result<json> s = Ctl({"status"});
    if (s.ok()) {
      BATON_RETURN_IF_ERROR(CrashLoopStatus(*s, log_));
      int standbys = 0;
      for (const json& e : s->value("engines", json::array())) {
        if (e.value("state", "") == "standby") ++standbys;
      }
      last = s->at("pair").value("state", "?");
      if (last == "ready" && standbys == 1 && !PrimaryOf(*s).address.empty()) return *s;
    } else {
      last = s.status().ToString();
    }
    std::this_thread::sleep_for(kPoll);
  }
  return DeadlineExceeded("the pair was not ready within " + std::to_string(limit.count()) +
                          " ms (last: " + last + "); see " + log_);
}

PrimaryInfo PrimaryOf(const json& status) {
  PrimaryInfo p;
  if (!status.contains("engines")) return p;
  for (const json& e : status["engines"]) {
    if (e.value("role", "") == "primary" && e.value("serving", false)) {
      p.engine_id = e.value("id", uint64_t{0});
      p.pid = e.value("pid", 0);
      p.address = e.value("http_address", "");
    }
  }
  return p;
}

}  // namespace baton::perf
