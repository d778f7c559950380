// `make serve` (scripts/serve) keeps the stack serving through failures it can recover from,
// as systemd's units would:
//   * The router killed while the controller is frozen (SIGSTOP): the new router does not
//     hold up the supervisor, which replaces the frozen controller; the router gets its route
//     table from the new one and serves again, and nothing is stopped.
//   * A frozen router (SIGSTOP) is found silent by the script's watchdog, killed with kill -9
//     and started again on its port.
//   * After the script gives up on a crash loop (the controller killed, its engines then
//     killed by the script), the engine cgroups of its stack are gone.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/chaos/chaos_harness.h"
#include "tests/deploy/deploy_support.h"
#include "tests/deploy/serve_script_support.h"

namespace baton::deploy_test {
namespace {

// The cgroup v2 directory of process `pid` (the cgroup2 mount point joined with its
// /proc/<pid>/cgroup path, less the mount's root), or "" when none is mounted.
std::string CgroupDirOf(pid_t pid) {
  std::string path;
  std::istringstream lines(ReadFile("/proc/" + std::to_string(pid) + "/cgroup"));
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("0::", 0) == 0) path = line.substr(3);
  }
  std::ifstream mounts("/proc/self/mountinfo");
  for (std::string line; std::getline(mounts, line);) {
    std::istringstream in(line);
    std::vector<std::string> f;
    for (std::string w; in >> w;) f.push_back(w);
    for (size_t i = 6; i + 1 < f.size(); ++i) {
      if (f[i] != "-" || f[i + 1] != "cgroup2") continue;
      const std::string root = f[3] == "/" ? "" : f[3];
      if (path.rfind(root, 0) == 0) return f[4] + path.substr(root.size());
    }
  }
  return "";
}

// The router's /health status, 0 when it does not answer.
int RouterHealth(int port) {
  return chaos::Fetch(static_cast<uint16_t>(port), chaos::http::verb::get, "/health", "",
                      seconds(2))
      .status;
}

// Whether the router on `port` answers /health 200 (it has a primary) within `limit`.
bool RouterServesWithin(int port, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (RouterHealth(port) != 200) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(100));
  }
  return true;
}

TEST_F(ServeScript, ARouterKilledWhileTheControllerIsFrozenComesBackWithTheNextController) {
  const pid_t controller = ProcessWith(runtime_ + "/controller.toml");
  const pid_t router = ProcessWith(runtime_ + "/router.toml");
  ASSERT_GT(controller, 0);
  ASSERT_GT(router, 0);
  ::kill(controller, SIGSTOP);
  ::kill(router, SIGKILL);
  EXPECT_TRUE(LogShows("serve: baton-router (pid " + std::to_string(router) +
                           ") exited with status 137: starting it again",
                       seconds(30)))
      << ReadFile(log_);
  // The frozen controller is still watched: killed, and a new one started.
  EXPECT_TRUE(LogShows(
      "serve: baton-controller (pid " + std::to_string(controller) + ") has not answered for",
      seconds(60)))
      << ReadFile(log_);
  EXPECT_TRUE(LogShows("serve: baton-router is back on 127.0.0.1:" + std::to_string(router_port_),
                       seconds(60)))
      << ReadFile(log_);
  EXPECT_TRUE(RouterServesWithin(router_port_, seconds(60))) << ReadFile(log_);
  const pid_t next = ProcessWith(runtime_ + "/router.toml");
  EXPECT_GT(next, 0);
  EXPECT_NE(next, router);
  EXPECT_EQ(EnginesOf(Socket()).size(), 2u) << ReadFile(log_);
  EXPECT_EQ(ReadFile(log_).find("serve: stopping"), std::string::npos) << ReadFile(log_);
  EXPECT_TRUE(script_->Running()) << ReadFile(log_);
}

TEST_F(ServeScript, AFrozenRouterIsKilledAndStartedAgain) {
  const pid_t router = ProcessWith(runtime_ + "/router.toml");
  ASSERT_GT(router, 0);
  ::kill(router, SIGSTOP);
  EXPECT_TRUE(LogShows(
      "serve: baton-router (pid " + std::to_string(router) + ") has not answered for", seconds(60)))
      << ReadFile(log_);
  EXPECT_TRUE(LogShows("serve: baton-router is back on 127.0.0.1:" + std::to_string(router_port_),
                       seconds(60)))
      << ReadFile(log_);
  EXPECT_TRUE(RouterServesWithin(router_port_, seconds(60))) << ReadFile(log_);
  const pid_t next = ProcessWith(runtime_ + "/router.toml");
  EXPECT_GT(next, 0);
  EXPECT_NE(next, router);
  EXPECT_TRUE(script_->Running()) << ReadFile(log_);
}

// The crash loop of serve_script_test.cc: the first controller is killed with kill -9, so
// nothing removes its engines' cgroups but the script.
TEST_F(ServeScript, GivingUpOnACrashLoopRemovesTheEngineCgroups) {
  const std::string controller = StartFromOwnBuildFolder("serve-crash-loop-cgroups.log", {});
  ASSERT_FALSE(HasFailure());
  const std::vector<pid_t> engines = EnginesOf(Socket());
  ASSERT_FALSE(engines.empty());
  const std::filesystem::path engine_dir = CgroupDirOf(engines.front());
  if (engine_dir.filename().string().rfind("engine-", 0) != 0) {
    GTEST_SKIP() << "the engines have no cgroup of their own: " << engine_dir;
  }
  const std::filesystem::path base = engine_dir.parent_path();
  ASSERT_EQ(base.filename().string().rfind("baton-", 0), 0u) << base;
  WriteScript(controller, "exit 1\n");
  const pid_t first = ProcessWith(runtime_ + "/controller.toml");
  ASSERT_GT(first, 0);
  ::kill(first, SIGKILL);
  EXPECT_EQ(script_->Wait(seconds(60)), 1) << ReadFile(log_);
  EXPECT_NE(ReadFile(log_).find("exited 6 times within 10 s"), std::string::npos) << ReadFile(log_);
  EXPECT_EQ(ProcessWith(runtime_ + "/router.toml"), 0) << "the router outlived the script\n"
                                                       << ReadFile(log_);
  EXPECT_FALSE(std::filesystem::exists(engine_dir)) << ReadFile(log_);
  EXPECT_FALSE(std::filesystem::exists(base)) << ReadFile(log_);
  EXPECT_TRUE(LeftAfterAWhile().empty()) << ReadFile(log_);
}

}  // namespace
}  // namespace baton::deploy_test
