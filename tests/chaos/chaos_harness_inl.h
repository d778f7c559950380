// Definitions of chaos_harness.h (included from it).
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "controller/engines/engine_cgroup.h"
#include "standby/mkmodel/model_presets.h"
#include "standby/mkmodel/model_writer.h"
#include "tests/chaos/chaos_harness.h"
#include "tests/weightcache/io/pinned_arena_testutil.h"

extern char** environ;

namespace baton::chaos {

inline const std::string& FiveMiBModelDir() {
  static const std::string* dir = [] {
    auto* path = new std::string("/tmp/baton-chaos-5m-" + std::to_string(::getpid()));
    ModelSpec spec = PresetSpec("tiny");
    spec.num_hidden_layers = 24;
    Result<ModelSummary> written = WriteModel(spec, *path);
    if (!written.ok()) ADD_FAILURE() << "writing the 5 MiB model: " << written.status().ToString();
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all("/tmp/baton-chaos-5m-" + std::to_string(::getpid()), ec);
    });
    return path;
  }();
  return *dir;
}

inline long HugePagesFree() { return arena_testing::HugePagesFree(); }

inline const std::string& TinyModelDir() {
  static const std::string* dir = [] {
    auto* path = new std::string("/tmp/baton-chaos-model-" + std::to_string(::getpid()));
    Result<ModelSummary> written = WriteModel(PresetSpec("tiny"), *path);
    if (!written.ok()) {
      ADD_FAILURE() << "writing the tiny model: " << written.status().ToString();
    }
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all("/tmp/baton-chaos-model-" + std::to_string(::getpid()), ec);
    });
    return path;
  }();
  return *dir;
}

inline std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

inline ChaosCluster::ChaosCluster(ClusterOptions options) {
  char tmpl[] = "/tmp/baton-chaos-XXXXXX";
  const char* made = ::mkdtemp(tmpl);
  dir_ = made != nullptr ? made : "/tmp/baton-chaos-failed";
  socket_ = dir_ + "/run/controller.sock";
  rogue_file_ = dir_ + "/rogue";
  violations_dir_ = dir_ + "/violations";
  std::filesystem::create_directories(violations_dir_);
  WriteConfig(options);
  if (!options.first_engine_rogue.empty()) ArmRogue(options.first_engine_rogue);
  ready_timeout_ = options.ready_timeout;
  StartController(options.controller_env);
  if (options.wait_ready) WaitReady("the pair to start");
}

inline ChaosCluster::~ChaosCluster() {
  if (controller_pid_ > 0) {
    StopController();
  } else {
    KillLeftovers();  // a test that killed the controller last: its engines outlive it
  }
  std::error_code ec;
  if (!::testing::Test::HasFailure()) std::filesystem::remove_all(dir_, ec);
}

inline void ChaosCluster::WriteConfig(const ClusterOptions& o) const {
  std::vector<std::string> command = o.engine_command;
  if (command.empty()) {
    command = {std::string(BATON_BIN_DIR) + "/baton_test_engine_helper", "--violations-dir",
               violations_dir_, "--rogue-file", rogue_file_};
    command.insert(command.end(), o.engine_args.begin(), o.engine_args.end());
  }
  command.insert(command.begin(), o.engine_wrapper.begin(), o.engine_wrapper.end());
  std::ofstream out(dir_ + "/controller.toml");
  out << "[controller]\nruntime_dir = " << Quote(dir_ + "/run") << "\n"
      << "metrics_port = " << o.metrics_port << "\n"
      << (o.epoch_reserve > 0 ? "epoch_reserve = " + std::to_string(o.epoch_reserve) + "\n" : "")
      << (o.readopt_timeout_ms > 0
              ? "readopt_timeout_ms = " + std::to_string(o.readopt_timeout_ms) + "\n"
              : "")
      << (o.router_socket.empty() ? "" : "router_socket = " + Quote(o.router_socket) + "\n")
      << "[model]\ndir = " << Quote(o.model_dir.empty() ? TinyModelDir() : o.model_dir)
      << "\nlock = false\n"
      << (o.weights_huge_pages ? "" : "huge_pages = false\n")
      << (o.weights_max_huge_pages >= 0
              ? "max_huge_pages = " + std::to_string(o.weights_max_huge_pages) + "\n"
              : "")
      << "[engine]\ncommand = [";
  for (size_t i = 0; i < command.size(); ++i) out << (i ? ", " : "") << Quote(command[i]);
  out << "]\nbase_port = " << o.base_port << "\nregister_timeout_ms = " << o.register_timeout_ms
      << "\n"
      << (o.engine_cgroup.empty() ? "" : "cgroup = " + Quote(o.engine_cgroup) + "\n")
      << (o.engine_logs ? "log_dir = " + Quote(dir_ + "/engine-logs") + "\n" : "")
      << (o.engine_log_keep > 0 ? "log_keep = " + std::to_string(o.engine_log_keep) + "\n" : "")
      << (o.engine_key_file.empty() ? "" : "key_file = " + Quote(o.engine_key_file) + "\n")
      << "promote_timeout_ms = " << o.promote_timeout_ms
      << "\ndrain_timeout_ms = 5000\nstop_grace_ms = 2000\n"
      << "[pool]\nblocks = " << o.blocks << "\nblock_bytes = " << o.block_bytes << "\n"
      << (o.promotion_reserve_blocks >= 0
              ? "promotion_reserve_blocks = " + std::to_string(o.promotion_reserve_blocks) + "\n"
              : "")
      << "[health]\nheartbeat_interval_ms = " << o.heartbeat_ms
      << "\nheartbeat_misses = " << o.heartbeat_misses
      << "\nprobe_timeout_ms = " << o.probe_timeout_ms << "\n"
      << (o.compute_stall_timeout_ms >= 0
              ? "compute_stall_timeout_ms = " + std::to_string(o.compute_stall_timeout_ms) + "\n"
              : "")
      << "[policy]\nmax_failures = " << o.max_failures
      << "\nfailure_window_s = 60\ninitial_backoff_ms = " << o.initial_backoff_ms
      << "\nmax_backoff_ms = 60000\n";
  if (o.standby_relaunch_delay_ms >= 0) {
    out << "standby_relaunch_delay_ms = " << o.standby_relaunch_delay_ms << "\n";
  }
  out << "[upgrade]\nmax_latency_ratio = " << o.max_latency_ratio << "\n";
  if (!o.gpu_backend.empty()) {
    out << "[gpu]\nbackend = " << Quote(o.gpu_backend) << "\n";
    if (o.gpu_probe_ms > 0) out << "probe_interval_ms = " << o.gpu_probe_ms << "\n";
    if (o.gpu_pool_chunk_bytes > 0) out << "pool_chunk_bytes = " << o.gpu_pool_chunk_bytes << "\n";
  }
  out << o.extra_toml;
}

inline void ChaosCluster::StartController(const std::vector<std::string>& env) {
  const std::string bin = std::string(BATON_BIN_DIR) + "/baton-controller";
  const std::string config = dir_ + "/controller.toml";
  const std::string log = dir_ + "/controller.log";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  std::vector<std::string> args = {bin, "--config", config};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> envs(env.begin(), env.end());
  for (char** e = environ; *e != nullptr; ++e) envs.push_back(*e);
  std::vector<char*> envp;
  for (std::string& e : envs) envp.push_back(e.data());
  envp.push_back(nullptr);
  const int rc =
      ::posix_spawn(&controller_pid_, bin.c_str(), &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  ASSERT_EQ(rc, 0) << "spawning " << bin << ": " << std::strerror(rc);
}

inline int ChaosCluster::StopController() {
  if (controller_pid_ <= 0) return -1;
  std::vector<pid_t> engines;
  json status = Status();
  if (status.contains("engines")) {
    for (const json& e : status["engines"]) engines.push_back(PidOf(e));
  }
  if (status.contains("controller")) {  // base/bug.h: the controller found itself wrong
    EXPECT_EQ(status["controller"].value("bugs", -1), 0) << status["controller"].dump();
  }
  ::kill(controller_pid_, SIGTERM);
  int wstatus = 0;
  for (int i = 0; i < 200; ++i) {  // 20 s
    if (::waitpid(controller_pid_, &wstatus, WNOHANG) == controller_pid_) {
      controller_pid_ = 0;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (controller_pid_ != 0) {
    ADD_FAILURE() << "the controller did not stop on SIGTERM\n" << Log();
    ::kill(controller_pid_, SIGKILL);
    ::waitpid(controller_pid_, &wstatus, 0);
    controller_pid_ = 0;
  }
  EXPECT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << "controller status " << wstatus;
  for (int i = 0; i < 50 && KeeperPid() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(KeeperPid(), 0) << "baton-keeper outlived a clean stop";
  for (pid_t pid : engines) {
    for (int i = 0; i < 50 && ProcessExists(pid); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    EXPECT_FALSE(ProcessExists(pid)) << "engine pid " << pid << " outlived the controller";
  }
  return wstatus;
}

inline CtlResult ChaosCluster::Ctl(const std::vector<std::string>& args) const {
  return RunCtl(/*json_output=*/true, args);
}

inline CtlResult ChaosCluster::CtlPlain(const std::vector<std::string>& args) const {
  return RunCtl(/*json_output=*/false, args);
}

inline CtlResult ChaosCluster::RunCtl(bool json_output,
                                      const std::vector<std::string>& args) const {
  std::string cmd = std::string(BATON_BIN_DIR) + "/batonctl" + (json_output ? " --json" : "") +
                    " --socket " + socket_;
  for (const std::string& a : args) cmd += " " + a;
  cmd += json_output ? " 2>/dev/null" : " 2>&1";
  CtlResult result;
  std::FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) return result;
  char buf[4096];
  while (std::fgets(buf, sizeof(buf), pipe) != nullptr) result.stdout_text += buf;
  const int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::string last = result.stdout_text;
  while (!last.empty() && last.back() == '\n') last.pop_back();
  last = last.substr(last.rfind('\n') == std::string::npos ? 0 : last.rfind('\n') + 1);
  if (json_output) result.out = json::parse(last, nullptr, /*allow_exceptions=*/false);
  return result;
}

inline json ChaosCluster::Status() const {
  CtlResult r = Ctl({"status"});
  return r.exit_code == 0 ? r.out : json();
}

inline json ChaosCluster::WaitFor(const std::function<bool(const json&)>& pred,
                                  const std::string& what, std::chrono::seconds timeout) const {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  json status;
  while (std::chrono::steady_clock::now() < deadline) {
    status = Status();
    if (!status.is_null() && status.contains("pair") && pred(status)) return status;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ADD_FAILURE() << "timed out waiting for " << what << "\nlast status: " << status.dump(2)
                << "\ncontroller log:\n"
                << Log();
  return status;
}

inline json ChaosCluster::WaitReady(const std::string& what) const {
  return WaitFor(IsReady, what, ready_timeout_);
}

inline std::vector<pid_t> ChaosCluster::RosterPids() const {
  std::vector<pid_t> pids;
  for (const char* slot : {"/run/state/roster.json", "/run/state/roster.1.json"}) {
    std::ifstream in(dir_ + slot);
    std::stringstream text;
    text << in.rdbuf();
    const json roster = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
    if (!roster.is_object() || !roster.contains("engines")) continue;
    for (const json& e : roster["engines"]) {
      if (const pid_t pid = e.value("pid", 0); pid > 0) pids.push_back(pid);
    }
  }
  return pids;
}

inline pid_t ChaosCluster::KeeperPid() const {
  std::ifstream in(dir_ + "/run/keeper.sock.pid");
  pid_t pid = 0;
  in >> pid;
  if (pid <= 0) return 0;
  std::ifstream cmdline("/proc/" + std::to_string(pid) + "/cmdline");
  std::string name;
  std::getline(cmdline, name, '\0');
  return name.find("baton-keeper") != std::string::npos ? pid : 0;
}

inline void ChaosCluster::KillLeftovers() {
  for (pid_t pid : RosterPids()) {
    if (pid > 0) ::kill(-pid, SIGKILL), ::kill(pid, SIGKILL);
  }
  if (const pid_t keeper = KeeperPid(); keeper > 0) ::kill(keeper, SIGKILL);
  std::string why_not;
  Result<std::unique_ptr<EngineCgroups>> cgroups =
      EngineCgroups::Open("auto", dir_ + "/run", &why_not);
  if (cgroups.ok() && *cgroups != nullptr) (*cgroups)->ClearLeftovers({});  // base removed too
}

inline void ChaosCluster::KillController() {
  ASSERT_GT(controller_pid_, 0);
  ::kill(controller_pid_, SIGKILL);
  ::waitpid(controller_pid_, nullptr, 0);
  controller_pid_ = 0;
}

inline int ChaosCluster::WaitControllerExit(std::chrono::seconds timeout) {
  if (controller_pid_ <= 0) return -1;
  int wstatus = 0;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (::waitpid(controller_pid_, &wstatus, WNOHANG) == controller_pid_) {
      controller_pid_ = 0;
      return wstatus;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ADD_FAILURE() << "the controller did not exit within " << timeout.count() << " s\n" << Log();
  return -1;
}

inline void ChaosCluster::RestartController() {
  StartController();
  WaitReady("the restarted controller's pair");
}

inline bool ChaosCluster::ControllerAlive() const {
  return controller_pid_ > 0 && ::waitpid(controller_pid_, nullptr, WNOHANG) == 0;
}

inline std::string ChaosCluster::Log() const {
  std::ifstream in(dir_ + "/controller.log");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

inline void ChaosCluster::ArmRogue(const std::string& mode) const {
  std::ofstream out(rogue_file_ + ".tmp");
  out << mode << "\n";
  out.close();
  std::filesystem::rename(rogue_file_ + ".tmp", rogue_file_);
}

// --- fencing checks -------------------------------------------------------------------------

struct PoolRange {
  uint64_t begin = 0;  // offset in the pool memfd
  uint64_t end = 0;
  bool writable = false;
};

// Mappings of the controller's pool memfd in `pid`'s address space.
inline std::vector<PoolRange> PoolMappings(pid_t pid) {
  std::vector<PoolRange> out;
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find("/memfd:baton-pool") == std::string::npos) continue;
    unsigned long long lo = 0, hi = 0, offset = 0;
    char perms[8] = {};
    if (std::sscanf(line.c_str(), "%llx-%llx %7s %llx", &lo, &hi, perms, &offset) != 4) continue;
    out.push_back(PoolRange{offset, offset + (hi - lo), perms[1] == 'w'});
  }
  return out;
}

// Who is who: id, pid, role and epoch of every engine.
inline json Roster(const json& status) {
  json out = json::array();
  if (!status.contains("engines")) return out;
  for (const json& e : status["engines"]) {
    out.push_back({e["id"], e["pid"], e["role"], e["epoch"]});
  }
  return out;
}

inline void ChaosCluster::CheckFencing() const {
  for (int attempt = 0; attempt < 20; ++attempt) {
    const json before = Status();
    const json canary = EngineWithRole(before, "canary");
    const bool canary_serves = !canary.is_null() && canary["serving"].get<bool>();
    if (!IsReady(before) && !canary_serves) {  // a serving canary holds blocks as the primary does
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    EXPECT_EQ(before["invariants"], "ok") << before.dump(2);
    std::map<pid_t, std::vector<PoolRange>> maps;
    for (const json& e : before["engines"]) maps[PidOf(e)] = PoolMappings(PidOf(e));
    if (Roster(Status()) != Roster(before)) continue;  // changed under us: look again
    std::vector<std::pair<pid_t, PoolRange>> writable;
    for (const json& e : before["engines"]) {
      const pid_t pid = PidOf(e);
      for (const PoolRange& r : maps[pid]) {
        // Read-only is allowed: every engine has the header view, the whole pool PROT_READ.
        if (r.writable && e["role"] != "primary" && e["role"] != "canary") {
          ADD_FAILURE() << "rule 5: " << e["role"] << " engine pid " << pid << " maps pool offset "
                        << r.begin << ".." << r.end << " writable";
        }
        if (r.writable) writable.emplace_back(pid, r);
      }
    }
    for (size_t i = 0; i < writable.size(); ++i) {
      for (size_t j = i + 1; j < writable.size(); ++j) {
        const bool overlap = writable[i].second.begin < writable[j].second.end &&
                             writable[j].second.begin < writable[i].second.end;
        EXPECT_FALSE(overlap && writable[i].first != writable[j].first)
            << "rule 1: pids " << writable[i].first << " and " << writable[j].first
            << " both map pool bytes " << writable[i].second.begin << " writable";
      }
    }
    for (const auto& entry : std::filesystem::directory_iterator(violations_dir_)) {
      std::ifstream in(entry.path());
      std::stringstream text;
      text << in.rdbuf();
      ADD_FAILURE() << "test engine found a fencing violation: " << text.str();
    }
    return;
  }
  ADD_FAILURE() << "the pair never held still long enough to check fencing\n" << Log();
}

}  // namespace baton::chaos
