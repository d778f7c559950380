// The fixture of the scripts/serve tests (serve_script_test.cc, serve_recovery_test.cc): it
// runs the script in its own process group and session, on the demo model, with its own
// runtime folder and free ports, as an operator's terminal would run it, and leaves nothing
// of the stack behind on any exit path of a test.
//
// Header-only test support (the test build compiles *_test.cc files only); used from the
// test's main thread.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "controller/engines/engine_cgroup.h"
#include "tests/chaos/chaos_harness.h"
#include "tests/deploy/deploy_support.h"
#include "tests/support/free_port.h"

namespace baton::deploy_test {

using std::chrono::milliseconds;
using std::chrono::seconds;

// The pid of the process whose command line holds `part`, or 0.
inline pid_t ProcessWith(const std::string& part) {
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmdline = ReadFile(entry.path().string() + "/cmdline");
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    if (cmdline.find(part) != std::string::npos) return std::stoi(name);
  }
  return 0;
}

using testing_support::FreePorts;

class ServeScript : public ::testing::Test {
 protected:
  void SetUp() override {
    runtime_ = ScratchDir("serve");
    Start("serve.log");
  }
  // Starts scripts/serve on runtime_, logging to `log` there, with `env` ("NAME=value") in
  // its environment, and waits for its pair.
  void Start(const std::string& log, const std::vector<std::string>& env = {}) {
    Launch(log, env);
    ASSERT_FALSE(HasFatalFailure());
    for (int i = 0; i < 600 && ReadFile(log_).find("Ctrl-C stops") == std::string::npos; ++i) {
      ASSERT_TRUE(script_->Running()) << ReadFile(log_);
      std::this_thread::sleep_for(milliseconds(100));
    }
    ASSERT_NE(ReadFile(log_).find("Ctrl-C stops"), std::string::npos) << ReadFile(log_);
    ASSERT_EQ(EnginesOf(Socket()).size(), 2u) << ReadFile(log_);
  }
  // Starts scripts/serve as Start() does, without waiting; `env` comes after the script's
  // ports, so that it may set one of them.
  void Launch(const std::string& log, const std::vector<std::string>& env) {
    log_ = runtime_ + "/" + log;
    pgid_ = 0;  // set again once the script runs
    // The engines on base and up (a few replacements at most), the router apart from them.
    const int base = FreePorts(4);
    ASSERT_GT(base, 0);
    int router = 0;
    for (int i = 0; i < 50 && (router <= 0 || (router >= base && router < base + 4)); ++i) {
      router = FreePorts(1);
    }
    ASSERT_TRUE(router > 0 && (router < base || router >= base + 4));
    router_port_ = router;
    // setsid, not a process group leader here, execs in place: the script's pid leads its group.
    std::vector<std::string> argv = {"/usr/bin/env",
                                     "BATON_RUNTIME_DIR=" + runtime_,
                                     "BATON_BUILD_DIR=" + BuildDir(),
                                     "BATON_BASE_PORT=" + std::to_string(base),
                                     "BATON_ROUTER_PORT=" + std::to_string(router),
                                     "BATON_METRICS_PORT=0"};
    argv.insert(argv.end(), env.begin(), env.end());
    argv.insert(argv.end(), {"setsid", "bash", SourceDir() + "/scripts/serve"});
    script_ = std::make_unique<Child>(argv, log_, /*piped=*/false);
    ASSERT_TRUE(script_->started());
    pgid_ = script_->pid();
  }
  void TearDown() override {  // on every path: nothing of the stack outlives the test
    StopScriptGroup();
    KillLeft();
    script_.reset();
    // A controller killed with kill -9 leaves its engines' cgroups: removed as the next
    // controller on this runtime directory would.
    std::string why_not;
    Result<std::unique_ptr<EngineCgroups>> cgroups =
        EngineCgroups::Open("auto", runtime_, &why_not);
    if (cgroups.ok() && *cgroups != nullptr) (*cgroups)->ClearLeftovers({});
    std::error_code ec;
    if (!HasFailure()) std::filesystem::remove_all(runtime_, ec);
  }

  // kill -9 to the script's process group, if one was started (never to group 0, which
  // would be this test's own).
  void StopScriptGroup() {
    if (pgid_ > 0) ::kill(-pgid_, SIGKILL);
    pgid_ = 0;
  }
  // Stops SetUp's stack and starts the script again (logging to `log`, with `env`) from a
  // build folder of its own, runtime_/build, whose bin/ links to the build's programs; the
  // test may then replace baton-controller there. Returns that baton-controller's path.
  std::string StartFromOwnBuildFolder(const std::string& log, std::vector<std::string> env) {
    StopScriptGroup();
    EXPECT_TRUE(KillLeft()) << Describe(Left()) << ReadFile(log_);
    script_.reset();
    const std::string build = runtime_ + "/build";
    std::filesystem::create_directories(build + "/bin");
    for (const auto& entry : std::filesystem::directory_iterator(BuildDir() + "/bin")) {
      std::filesystem::create_symlink(entry.path(),
                                      build + "/bin/" + entry.path().filename().string());
    }
    env.push_back("BATON_BUILD_DIR=" + build);
    Start(log, env);
    return build + "/bin/baton-controller";
  }
  // Replaces the program at `path` with a shell script of `body`.
  static void WriteScript(const std::string& path, const std::string& body) {
    std::filesystem::remove(path);
    std::ofstream(path) << "#!/bin/sh\n" << body;
    std::filesystem::permissions(path, std::filesystem::perms::owner_all);
  }
  // Whether the script's log holds `text` within `limit`, polled while the script runs.
  bool LogShows(const std::string& text, std::chrono::milliseconds limit) const {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (ReadFile(log_).find(text) == std::string::npos) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(milliseconds(50));
    }
    return true;
  }

  std::string Socket() const { return runtime_ + "/controller.sock"; }
  pid_t KeeperPid() const {
    pid_t pid = 0;
    std::ifstream(runtime_ + "/keeper.sock.pid") >> pid;
    return pid > 0 && ::kill(pid, 0) == 0 ? pid : 0;
  }
  // The stack's processes still there: engines, controller, router, keeper.
  std::vector<pid_t> Left() const {
    std::vector<pid_t> left = EnginesOf(Socket());
    for (const std::string& part : {runtime_ + "/controller.toml", runtime_ + "/router.toml"}) {
      if (const pid_t pid = ProcessWith(part); pid > 0) left.push_back(pid);
    }
    if (const pid_t keeper = KeeperPid(); keeper > 0) left.push_back(keeper);
    return left;
  }
  // kill -9 to what is left of the stack, again until nothing is (a controller not yet
  // killed may start an engine in place of one just killed); false if something is left
  // after 10 s.
  bool KillLeft() const {
    const auto deadline = std::chrono::steady_clock::now() + seconds(10);
    for (std::vector<pid_t> left = Left(); !left.empty(); left = Left()) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      for (pid_t pid : left) ::kill(pid, SIGCONT), ::kill(pid, SIGKILL);
      std::this_thread::sleep_for(milliseconds(100));
    }
    return true;
  }
  // Each of `pids` with its /proc stat line, one a line.
  static std::string Describe(const std::vector<pid_t>& pids) {
    std::string out;
    for (pid_t pid : pids) out += ReadFile("/proc/" + std::to_string(pid) + "/stat") + "\n";
    return out;
  }
  // Waits up to 5 s for the killed to finish dying.
  std::vector<pid_t> LeftAfterAWhile() const {
    for (int i = 0; i < 50 && !Left().empty(); ++i) std::this_thread::sleep_for(milliseconds(100));
    return Left();
  }

  std::string runtime_, log_;
  std::unique_ptr<Child> script_;
  pid_t pgid_ = 0;
  int router_port_ = 0;  // the router's, as Launch() chose it
};

}  // namespace baton::deploy_test
