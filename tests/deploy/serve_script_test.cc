// `make serve` (scripts/serve) stops everything it started, however it is told to stop: the
// script runs in its own process group and session, on the demo model, with its own runtime
// folder and free ports, as an operator's terminal would run it.
//   * SIGTERM to the process group twice in a row, as make passes a TERM on to the script: the
//     router, the controller, its engines and baton-keeper are all gone, exit 0.
//   * Ctrl-C (SIGINT to the group) while the controller is frozen (SIGSTOP): it is continued
//     and stops at once. A controller that ignores SIGTERM, then a second Ctrl-C: what is
//     left gets kill -9 at once, and nothing of the stack remains.
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
// serve_recovery_test.cc has the failures the script recovers from while it serves on.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "proto/http/http_server.h"
#include "tests/chaos/chaos_harness.h"
#include "tests/deploy/deploy_support.h"
#include "tests/deploy/serve_script_support.h"

namespace baton::deploy_test {
namespace {

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

// A stopped controller handles no SIGTERM: the script continues it (SIGCONT) rather than wait
// 15 s for it, and it stops its engines as usual.
TEST_F(ServeScript, CtrlCStopsAFrozenControllerAtOnce) {
  const pid_t controller = ProcessWith(runtime_ + "/controller.toml");
  ASSERT_GT(controller, 0);
  ::kill(controller, SIGSTOP);
  ::kill(-pgid_, SIGINT);
  EXPECT_EQ(script_->Wait(seconds(30)), 0) << ReadFile(log_);
  EXPECT_NE(
      ReadFile(log_).find("pid " + std::to_string(controller) + " is stopped (SIGSTOP): SIGCONT"),
      std::string::npos)
      << ReadFile(log_);
  EXPECT_NE(ReadFile(log_).find("serve: stopped: controller exited 0, no engine left"),
            std::string::npos)
      << ReadFile(log_);
  EXPECT_TRUE(LeftAfterAWhile().empty()) << ReadFile(log_);
}

// A controller that does not stop on SIGTERM (here one that ignores it: the script runs from
// a build folder whose baton-controller, after the real one is killed, is such a program),
// then a second Ctrl-C: what is left gets kill -9 at once, and nothing of the stack remains.
TEST_F(ServeScript, ASecondCtrlCStopsAControllerThatDoesNotStopAndWhatItLeft) {
  const std::string controller = StartFromOwnBuildFolder("serve-second-ctrl-c.log", {});
  ASSERT_FALSE(HasFailure());
  // The stand-in says when it ignores SIGTERM: a Ctrl-C before that would end it at once.
  const std::string ignoring = runtime_ + "/stand-in-ignores-term";
  WriteScript(controller, "trap '' TERM\ntouch " + ignoring + "\nwhile :; do sleep 1; done\n");
  const pid_t first = ProcessWith(runtime_ + "/controller.toml");
  ASSERT_GT(first, 0);
  ::kill(first, SIGKILL);
  ASSERT_TRUE(LogShows("starting it again", seconds(30))) << ReadFile(log_);
  for (int i = 0; i < 300 && !std::filesystem::exists(ignoring); ++i) {
    std::this_thread::sleep_for(milliseconds(100));
  }
  ASSERT_TRUE(std::filesystem::exists(ignoring)) << ReadFile(log_);
  ::kill(-pgid_, SIGINT);
  // The script prints this once its stop() has set the trap that takes a second Ctrl-C; a
  // second SIGINT before that would merge with the first.
  ASSERT_TRUE(LogShows("serve: stopping baton-controller", seconds(30))) << ReadFile(log_);
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
