// `make serve` (scripts/serve) stops everything it started, however it is told to stop: the
// script runs in its own process group and session, on the demo model, with its own runtime
// folder and free ports, as an operator's terminal would run it.
//   * SIGTERM to the process group twice in a row, as make passes a TERM on to the script: the
//     router, the controller, its engines and baton-keeper are all gone, exit 0.
//   * Ctrl-C (SIGINT to the group) while the controller is frozen (SIGSTOP), then a second
//     Ctrl-C: what is left gets kill -9 at once, and nothing of the stack remains.
//   * A frozen controller (SIGSTOP) is killed by the script's watchdog and replaced; the new
//     controller re-adopts the same engines.
//   * A restarted controller that never answers is killed at BATON_START_TIMEOUT_S.
//   * A crash loop: the script gives up and stops the engines and the keeper it leaves.
//   * A pair drained (`batonctl drain`) and stopped with the script stays drained in the
//     state directory; the next `make serve` resumes it, and says so.
//   * A router port another server holds, one that answers /health (another stack's router,
//     or a server whose listening socket the script inherited): the script's own router
//     cannot listen, and the script says so and stops what it started, rather than announce
//     the other server as its stack.
//   * A router that exits while the stack serves is started again on its port.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>

#include <algorithm>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "base/io/unique_fd.h"
#include "controller/engines/engine_cgroup.h"
#include "proto/http/http_server.h"
#include "tests/chaos/chaos_harness.h"
#include "tests/deploy/deploy_support.h"

namespace baton::deploy_test {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// The pid of the process whose command line holds `part`, or 0.
pid_t ProcessWith(const std::string& part) {
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmdline = ReadFile(entry.path().string() + "/cmdline");
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    if (cmdline.find(part) != std::string::npos) return std::stoi(name);
  }
  return 0;
}

// Whether 127.0.0.1:`port` can be bound now, with SO_REUSEADDR as the engines' and the
// router's HTTP servers bind (proto/http/http_server.cc): a port that only closed
// connections (TIME_WAIT, many when other tests run load beside this one) still use is free.
bool PortFree(int port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  const int on = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_port = htons(static_cast<uint16_t>(port));
  at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return ::bind(fd.get(), reinterpret_cast<sockaddr*>(&at), sizeof(at)) == 0;
}

// `n` consecutive free ports (the engines take the base port and those after it), or 0.
// They are drawn below the kernel's ephemeral range (net.ipv4.ip_local_port_range), which
// no outgoing connection takes: next to a port the kernel picks, ports are often held by
// closed connections in TIME_WAIT (many when other tests run load beside this one), which a
// server's bind conflicts with even with SO_REUSEADDR.
int FreePorts(int n) {
  int low = 32768;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> low;
  const int first = 10000;
  const int last = std::min(low, 65536) - n;
  if (last <= first) return 0;
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int> pick(first, last);
  for (int tries = 0; tries < 500; ++tries) {
    const int base = pick(rng);
    bool all = true;
    for (int i = 0; all && i < n; ++i) all = PortFree(base + i);
    if (all) return base;
  }
  return 0;
}

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

// The same, with no stack started before the test.
class ServeScriptAlone : public ServeScript {
 protected:
  void SetUp() override { runtime_ = ScratchDir("serve"); }

  // The script on a router port that another server holds and answers /health on: the
  // script's router exits, unable to listen, and the script must not take the other server's
  // answer for its own, but say so and stop what it started.
  void ExpectRefusedOn(int port, const std::string& log_name) {
    const std::string p = std::to_string(port);
    Launch(log_name, {"BATON_ROUTER_PORT=" + p});
    ASSERT_FALSE(HasFatalFailure());
    // The pair first (60 s at most), then the router that cannot listen.
    EXPECT_EQ(script_->Wait(seconds(120)), 1) << ReadFile(log_);
    const std::string log = ReadFile(log_);
    EXPECT_NE(log.find("cannot listen on 127.0.0.1:" + p), std::string::npos) << log;
    EXPECT_NE(
        log.find("serve: baton-router exited (is port " + p + " taken? set BATON_ROUTER_PORT)"),
        std::string::npos)
        << log;
    EXPECT_EQ(log.find("Baton is serving"), std::string::npos) << log;
    EXPECT_TRUE(LeftAfterAWhile().empty()) << log;
  }
};

// A server on 127.0.0.1 (an ephemeral port) in this process that answers GET /health with
// 200, as a router with a primary does; it stops with the object.
class OtherHealthServer {
 public:
  OtherHealthServer() : server_(io_, HttpServerOptions{}) {
    server_.Route(boost::beast::http::verb::get, "/health", [](std::shared_ptr<HttpExchange> ex) {
      ex->RespondJson(200, R"({"status":"ok"})");
    });
    listening_ = server_.Listen().ok();
    thread_ = std::thread([this] { io_.run(); });
  }
  ~OtherHealthServer() {
    io_.stop();
    thread_.join();
  }
  OtherHealthServer(const OtherHealthServer&) = delete;
  OtherHealthServer& operator=(const OtherHealthServer&) = delete;

  bool listening() const { return listening_; }
  int port() const { return server_.port(); }

 private:
  boost::asio::io_context io_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_{
      io_.get_executor()};
  HttpServer server_;
  bool listening_ = false;
  std::thread thread_;
};

TEST_F(ServeScript, TermTwiceToItsGroupStopsEverything) {
  ::kill(-pgid_, SIGTERM);
  std::this_thread::sleep_for(milliseconds(50));
  ::kill(-pgid_, SIGTERM);  // make's own copy of the signal
  EXPECT_EQ(script_->Wait(seconds(40)), 0) << ReadFile(log_);
  EXPECT_NE(ReadFile(log_).find("serve: stopped: controller exited 0, no engine left"),
            std::string::npos)
      << ReadFile(log_);
  EXPECT_TRUE(LeftAfterAWhile().empty()) << ReadFile(log_);
}

TEST_F(ServeScript, ASecondCtrlCStopsAFrozenControllerAndWhatItLeft) {
  const pid_t controller = ProcessWith(runtime_ + "/controller.toml");
  ASSERT_GT(controller, 0);
  ::kill(controller, SIGSTOP);
  ::kill(-pgid_, SIGINT);
  // The script prints this once its stop() has set the trap that takes a second Ctrl-C; a
  // second SIGINT before that would merge with the first.
  ASSERT_TRUE(LogShows("serve: stopping baton-router", seconds(30))) << ReadFile(log_);
  ::kill(-pgid_, SIGINT);
  EXPECT_NE(script_->Wait(seconds(30)), 128 + SIGKILL) << "it ended on its own\n" << ReadFile(log_);
  EXPECT_NE(ReadFile(log_).find("has not stopped: kill -9"), std::string::npos) << ReadFile(log_);
  EXPECT_TRUE(LeftAfterAWhile().empty()) << ReadFile(log_);
}

TEST_F(ServeScript, AFrozenControllerIsReplacedAndItsEnginesReadopted) {
  const pid_t controller = ProcessWith(runtime_ + "/controller.toml");
  ASSERT_GT(controller, 0);
  std::vector<pid_t> engines = EnginesOf(Socket());
  std::sort(engines.begin(), engines.end());
  ::kill(controller, SIGSTOP);
  pid_t next = 0;
  for (int i = 0; i < 300 && (next == 0 || next == controller); ++i) {
    std::this_thread::sleep_for(milliseconds(100));
    next = ProcessWith(runtime_ + "/controller.toml");
  }
  ASSERT_NE(next, controller) << ReadFile(log_);
  EXPECT_NE(ReadFile(log_).find("has not answered for"), std::string::npos) << ReadFile(log_);
  std::vector<pid_t> now;
  for (int i = 0; i < 100 && now != engines; ++i) {
    std::this_thread::sleep_for(milliseconds(100));
    now = EnginesOf(Socket());
    std::sort(now.begin(), now.end());
  }
  EXPECT_EQ(now, engines) << "the same engines, re-adopted\n" << ReadFile(log_);
  EXPECT_TRUE(script_->Running()) << ReadFile(log_);
}

// A restarted controller that never answers is killed at the start timeout, not left
// unsupervised: the script runs from a build folder whose baton-controller is, for one
// restart, a program that never answers; once the real one is back, a pair serves again.
TEST_F(ServeScript, ARestartedControllerThatNeverAnswersIsKilledAtTheStartTimeout) {
  // The real controller, restarted after the silent one, has 10 s to answer on a loaded host.
  const std::string controller =
      StartFromOwnBuildFolder("serve-start-timeout.log", {"BATON_START_TIMEOUT_S=10"});
  ASSERT_FALSE(HasFailure());
  // Started once, the silent controller puts the real one back in its place, so that the
  // script's next restart starts the real one whenever it comes.
  WriteScript(controller, "ln -s '" + BuildDir() +
                              "/bin/baton-controller' \"$0.real\" && mv -f \"$0.real\" \"$0\"\n"
                              "exec sleep 600\n");
  const pid_t first = ProcessWith(runtime_ + "/controller.toml");
  ASSERT_GT(first, 0);
  ::kill(first, SIGKILL);
  // The silent one is killed 10 s after its spawn, the script's poll at most 0.75 s later.
  EXPECT_TRUE(LogShows("after its start: kill -9", seconds(60))) << ReadFile(log_);
  std::vector<pid_t> engines;
  const auto deadline = std::chrono::steady_clock::now() + seconds(60);
  while (engines.size() != 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(100));
    const std::string status = BuildDir() + "/bin/batonctl --socket " + Socket() +
                               " --json status 2>/dev/null | tail -n 1 | grep -q " +
                               "'\"state\":\"ready\"'";
    if (std::system(status.c_str()) == 0) engines = EnginesOf(Socket());
  }
  EXPECT_EQ(engines.size(), 2u) << "a pair again\n" << ReadFile(log_);
  EXPECT_TRUE(script_->Running()) << ReadFile(log_);
}

// A controller that keeps dying is a crash loop: the script gives up, and stops the engines
// and the keeper that no controller would supervise any more, naming them. The script runs
// from a build folder whose baton-controller, once the real one is killed, exits at once, so
// that its six exits come well within the 10 s however loaded the host.
TEST_F(ServeScript, GivingUpOnACrashLoopStopsTheEnginesAndTheKeeper) {
  const std::string controller = StartFromOwnBuildFolder("serve-crash-loop.log", {});
  ASSERT_FALSE(HasFailure());
  WriteScript(controller, "exit 1\n");
  const pid_t first = ProcessWith(runtime_ + "/controller.toml");
  ASSERT_GT(first, 0);
  ::kill(first, SIGKILL);
  EXPECT_EQ(script_->Wait(seconds(60)), 1) << ReadFile(log_);
  EXPECT_NE(ReadFile(log_).find("exited 6 times within 10 s"), std::string::npos) << ReadFile(log_);
  EXPECT_NE(ReadFile(log_).find("no controller supervises engines"), std::string::npos)
      << ReadFile(log_);
  EXPECT_TRUE(LeftAfterAWhile().empty()) << ReadFile(log_);
}

TEST_F(ServeScript, TheNextServeResumesAPairDrainedBeforeIt) {
  const std::string drain = BuildDir() + "/bin/batonctl --socket " + Socket() + " drain >/dev/null";
  ASSERT_EQ(std::system(drain.c_str()), 0);
  for (int i = 0; i < 100 && !EnginesOf(Socket()).empty(); ++i) {
    std::this_thread::sleep_for(milliseconds(100));
  }
  ASSERT_TRUE(EnginesOf(Socket()).empty()) << "the drained pair stopped\n" << ReadFile(log_);
  ::kill(-pgid_, SIGTERM);
  ASSERT_EQ(script_->Wait(seconds(40)), 0) << ReadFile(log_);
  ASSERT_TRUE(LeftAfterAWhile().empty()) << ReadFile(log_);
  Start("serve-again.log");  // its pair ready, two engines (as SetUp checks)
  EXPECT_NE(ReadFile(log_).find("taken out of service (batonctl drain) before this start"),
            std::string::npos)
      << ReadFile(log_);
}

// Another stack's router (one with a primary: /health 200) holds the port.
TEST_F(ServeScriptAlone, ARouterPortAnotherRouterAnswersOnIsRefused) {
  chaos::RouterProcess other({"--backend", "127.0.0.1:1"}, runtime_, "other-router.log");
  ASSERT_TRUE(other.ready()) << other.Log();
  ExpectRefusedOn(other.port(), "serve-port-taken.log");
}

// A server of this test holds the port: the script inherits its listening socket, and so
// does the script's router, which holds a socket listening there without having bound it.
TEST_F(ServeScriptAlone, ARouterPortTheScriptInheritedIsRefused) {
  OtherHealthServer other;
  ASSERT_TRUE(other.listening());
  ExpectRefusedOn(other.port(), "serve-port-inherited.log");
}

// A router that exits while the stack serves is started again on the same port, as the
// unit's Restart=always would, rather than leave the stack serving with no front door.
TEST_F(ServeScript, ARouterThatExitsIsStartedAgain) {
  const pid_t router = ProcessWith(runtime_ + "/router.toml");
  ASSERT_GT(router, 0);
  ::kill(router, SIGKILL);
  EXPECT_TRUE(LogShows("serve: baton-router (pid " + std::to_string(router) +
                           ") exited with status 137: starting it again",
                       seconds(30)))
      << ReadFile(log_);
  EXPECT_TRUE(LogShows("serve: baton-router is back on 127.0.0.1:" + std::to_string(router_port_),
                       seconds(30)))
      << ReadFile(log_);
  const pid_t next = ProcessWith(runtime_ + "/router.toml");
  EXPECT_GT(next, 0);
  EXPECT_NE(next, router);
  EXPECT_EQ(chaos::Fetch(static_cast<uint16_t>(router_port_), chaos::http::verb::get, "/health", "")
                .status,
            200)
      << ReadFile(log_);
  EXPECT_TRUE(script_->Running()) << ReadFile(log_);
}

}  // namespace
}  // namespace baton::deploy_test
