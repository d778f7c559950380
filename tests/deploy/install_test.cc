// `make install DESTDIR=...` into a scratch root, then the stack run from there with the
// installed example configurations: the controller (which starts the installed baton-keeper
// from beside itself), its reference-engine pair and the router, found with the installed
// batonctl through the controller's config; a completion through the router; and a clean stop.
// Only what a scratch root must change is rewritten in the configs: the root itself, the
// runtime, state and log folders, the model, ports, and a pool small enough for a test.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <regex>

#include "tests/chaos/chaos_harness.h"
#include "tests/deploy/deploy_support.h"

namespace baton::deploy_test {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// CMAKE_INSTALL_PREFIX of the build.
std::string InstallPrefix() {
  std::smatch m;
  const std::string cache = ReadFile(BuildDir() + "/CMakeCache.txt");
  if (std::regex_search(cache, m, std::regex(R"(CMAKE_INSTALL_PREFIX:PATH=(\S+))"))) return m[1];
  return "/usr/local";
}

class Installed : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ScratchDir("install");
    destdir_ = dir_ + "/root";
    root_ = destdir_ + InstallPrefix();
  }
  void TearDown() override {
    if (router_ != nullptr) {
      router_->Signal(SIGTERM);
      router_->Wait(seconds(20));
    }
    if (controller_ != nullptr) {
      controller_->Signal(SIGTERM);
      controller_->Wait(seconds(20));
    }
    for (pid_t pid : EnginesOf(socket_)) ::kill(-pid, SIGKILL), ::kill(pid, SIGKILL);
    if (const pid_t keeper = KeeperPid(); keeper > 0) ::kill(keeper, SIGKILL);
    std::error_code ec;
    if (!HasFailure()) std::filesystem::remove_all(dir_, ec);
  }

  pid_t KeeperPid() const {
    pid_t pid = 0;
    std::ifstream(dir_ + "/run/keeper.sock.pid") >> pid;
    return pid > 0 && ::kill(pid, 0) == 0 ? pid : 0;
  }

  // An installed example config with the scratch root's paths.
  std::string Rewritten(const std::string& name,
                        const std::vector<std::pair<std::string, std::string>>& more) {
    std::string text = ReadFile(root_ + "/share/baton/config/" + name);
    EXPECT_FALSE(text.empty()) << name << " was not installed";
    text = ReplaceAll(text, InstallPrefix() + "/bin/", root_ + "/bin/");
    text = ReplaceAll(text, "\"/run/baton", "\"" + dir_ + "/run");
    text = ReplaceAll(text, "\"/var/lib/baton\"", "\"" + dir_ + "/state\"");
    text = ReplaceAll(text, "\"/var/log/baton\"", "\"" + dir_ + "/log\"");
    for (const auto& [from, to] : more) {
      EXPECT_NE(text.find(from), std::string::npos) << name << " has no " << from;
      text = ReplaceAll(text, from, to);
    }
    const std::string path = dir_ + "/" + name;
    WriteFile(path, text);
    return path;
  }

  std::string dir_, destdir_, root_;
  std::string socket_;
  std::unique_ptr<Child> controller_, router_;
};

TEST_F(Installed, MakeInstallThenTheStackRunsFromTheScratchRoot) {
  const ProgramRun install =
      RunProgram({"/usr/bin/make", "-C", SourceDir(), "--no-print-directory", "install",
                  "DESTDIR=" + destdir_, "BUILD_DIR=" + BuildDir(), "JOBS=2"},
                 seconds(600));
  ASSERT_EQ(install.code, 0) << install.output;
  for (const char* file : {"bin/baton-controller",
                           "bin/baton-keeper",
                           "bin/baton-router",
                           "bin/batonctl",
                           "bin/baton-refengine",
                           "bin/baton-weights",
                           "bin/baton-mkmodel",
                           "lib/systemd/system/baton-controller.service",
                           "lib/systemd/system/baton-router.service",
                           "lib/sysusers.d/baton.conf",
                           "lib/tmpfiles.d/baton.conf",
                           "share/baton/config/controller.toml",
                           "share/baton/config/controller-fleet.toml",
                           "share/baton/config/router.toml",
                           "share/baton/config/router-fleet.toml",
                           "share/baton/prometheus/baton-alerts.yml",
                           "share/baton/prometheus/baton-rules.yml",
                           "share/baton/prometheus/prometheus.yml",
                           "share/baton/grafana/baton.json",
                           "share/baton/grafana/baton-dashboards.yml",
                           "share/baton/sysctl/90-baton-hugepages.conf",
                           "include/baton/baton_engine.h"}) {
    EXPECT_TRUE(std::filesystem::exists(root_ + "/" + std::string(file)))
        << file << " was not installed";
  }
  const std::string sysconf = InstallPrefix() == "/usr" ? destdir_ + "/etc" : root_ + "/etc";
  EXPECT_TRUE(std::filesystem::exists(sysconf + "/baton/controller.toml"));
  // The scrape configuration and the dashboard's provisioning name this install's paths.
  EXPECT_NE(ReadFile(root_ + "/share/baton/prometheus/prometheus.yml")
                .find("- " + InstallPrefix() + "/share/baton/prometheus/baton-rules.yml"),
            std::string::npos);
  EXPECT_NE(ReadFile(root_ + "/share/baton/grafana/baton-dashboards.yml")
                .find("path: " + InstallPrefix() + "/share/baton/grafana"),
            std::string::npos);
  const std::string unit = ReadFile(root_ + "/lib/systemd/system/baton-controller.service");
  EXPECT_NE(unit.find("ExecStart=" + InstallPrefix() + "/bin/baton-controller --config "),
            std::string::npos)
      << unit;

  // The controller and its keeper, from the scratch root, with the installed config.
  const int metrics_port = chaos::FreePort();
  const std::string controller_config =
      Rewritten("controller.toml",
                {{"\"/var/lib/baton/models/llama-8b\"", "\"" + chaos::TinyModelDir() + "\""},
                 {"metrics_port = 9464", "metrics_port = " + std::to_string(metrics_port)},
                 {"base_port = 8101", "base_port = 0"},
                 {"blocks = 1024", "blocks = 32"}});
  socket_ = dir_ + "/run/controller.sock";
  std::filesystem::create_directories(dir_ + "/log");
  std::filesystem::create_directories(dir_ + "/run-routes");  // deploy/tmpfiles makes it
  controller_ = std::make_unique<Child>(
      std::vector<std::string>{root_ + "/bin/baton-controller", "--config", controller_config},
      dir_ + "/controller.log", /*piped=*/false);
  const auto ctl = [&](const std::string& command) {
    return RunProgram({root_ + "/bin/batonctl", "--config", controller_config, "--json", command});
  };
  json status;
  const auto deadline = std::chrono::steady_clock::now() + seconds(60);
  while (std::chrono::steady_clock::now() < deadline && controller_->Running()) {
    const ProgramRun run = ctl("status");
    const std::string last = run.output.substr(
        run.output.rfind('{') == std::string::npos ? 0 : run.output.rfind("\n{") + 1);
    status = json::parse(last, nullptr, false);
    if (chaos::IsReady(status)) break;
    std::this_thread::sleep_for(milliseconds(100));
  }
  ASSERT_TRUE(chaos::IsReady(status)) << status.dump(1) << "\n"
                                      << ReadFile(dir_ + "/controller.log");
  const pid_t keeper = KeeperPid();
  ASSERT_GT(keeper, 0) << ReadFile(dir_ + "/controller.log");
  EXPECT_EQ(std::filesystem::read_symlink("/proc/" + std::to_string(keeper) + "/exe").string(),
            root_ + "/bin/baton-keeper");
  EXPECT_EQ(status["controller"]["keeper"]["state"], "keeping") << status["controller"].dump();
  for (const json& e : status["engines"]) {
    EXPECT_EQ(
        std::filesystem::read_symlink("/proc/" + std::to_string(chaos::PidOf(e)) + "/exe").string(),
        root_ + "/bin/baton-refengine");
  }
  const chaos::Reply metrics = HttpGet("127.0.0.1", metrics_port, "/metrics");
  EXPECT_NE(metrics.body.find("baton_build_info{program=\"baton-controller\""), std::string::npos)
      << metrics.body.substr(0, 500);

  // The router, from the scratch root, with the installed config.
  const uint16_t router_port = chaos::FreePort();
  const std::string router_config =
      Rewritten("router.toml", {{"listen = \"0.0.0.0:8000\"",
                                 "listen = \"127.0.0.1:" + std::to_string(router_port) + "\""}});
  router_ = std::make_unique<Child>(
      std::vector<std::string>{root_ + "/bin/baton-router", "--config", router_config},
      dir_ + "/router.log", /*piped=*/false);
  chaos::Reply answer;
  for (int i = 0; i < 200 && router_->Running(); ++i) {
    answer = chaos::Fetch(router_port, chaos::http::verb::post, "/v1/completions",
                          R"({"model": "llama-8b", "prompt": "installed", "max_tokens": 4})");
    if (answer.status == 200) break;
    std::this_thread::sleep_for(milliseconds(50));
  }
  EXPECT_EQ(answer.status, 200) << answer.body << answer.error << ReadFile(dir_ + "/router.log");

  // A clean stop: the router drains and exits 0; the controller stops its engines and its
  // keeper lets the memory go.
  router_->Signal(SIGTERM);
  EXPECT_EQ(router_->Wait(seconds(40)), 0) << ReadFile(dir_ + "/router.log");
  router_.reset();
  controller_->Signal(SIGTERM);
  EXPECT_EQ(controller_->Wait(seconds(30)), 0) << ReadFile(dir_ + "/controller.log");
  controller_.reset();
  for (int i = 0; i < 50 && (KeeperPid() > 0 || !EnginesOf(socket_).empty()); ++i) {
    std::this_thread::sleep_for(milliseconds(100));
  }
  EXPECT_EQ(KeeperPid(), 0) << "baton-keeper outlived a clean stop";
  EXPECT_TRUE(EnginesOf(socket_).empty()) << "engines outlived a clean stop";
}

}  // namespace
}  // namespace baton::deploy_test
