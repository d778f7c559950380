#include "controller/engines/supervisor.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

namespace baton {
namespace {

// Waits until the child's pidfd is readable (it exited), then reaps it.
ExitInfo WaitExit(ChildProcess& child) {
  pollfd pfd{.fd = child.pidfd(), .events = POLLIN, .revents = 0};
  EXPECT_EQ(::poll(&pfd, 1, 10'000), 1) << "the pidfd never became readable";
  Result<std::optional<ExitInfo>> exit = child.TryReap();
  EXPECT_TRUE(exit.ok() && exit->has_value());
  return exit.ok() && exit->has_value() ? **exit : ExitInfo{};
}

TEST(Supervisor, ExpandsPlaceholders) {
  const std::map<std::string, std::string> v = {{"socket", "/s"}, {"port", "8101"}};
  EXPECT_EQ(ExpandPlaceholders("--socket={socket} --port {port}", v), "--socket=/s --port 8101");
  EXPECT_EQ(ExpandPlaceholders("{unknown} {socket", v), "{unknown} {socket");
  Supervisor sup({"eng", "{socket}", "{token}", "{role}", "{engine_id}", "{port}", "{model_dir}",
                  "{runtime_dir}"},
                 "/run/c.sock", "/m", "/run", "");
  EXPECT_EQ(
      sup.Expand({.engine_id = 7, .role = proto::LaunchRole::kStandby, .token = "tok", .port = 9}),
      (std::vector<std::string>{"eng", "/run/c.sock", "tok", "standby", "7", "9", "/m", "/run"}));
  Supervisor fleet({"eng", "--host", "{host}"}, "/run/c.sock", "/m", "/run", "");
  EXPECT_EQ(fleet.Expand(
                {.engine_id = 1, .role = proto::LaunchRole::kPrimary, .token = "t", .port = 9})[2],
            "127.0.0.1");  // engine.host's default
  fleet.SetHost("10.0.0.7");
  EXPECT_EQ(fleet.Expand(
                {.engine_id = 1, .role = proto::LaunchRole::kPrimary, .token = "t", .port = 9})[2],
            "10.0.0.7");
}

TEST(Supervisor, TokensAreRandomHex) {
  Result<std::string> a = Supervisor::NewToken();
  Result<std::string> b = Supervisor::NewToken();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->size(), 32u);
  EXPECT_NE(*a, *b);
  EXPECT_EQ(a->find_first_not_of("0123456789abcdef"), std::string::npos);
}

TEST(Supervisor, PidfdSeesExitAndReapsItsStatus) {
  Result<ChildProcess> child = ChildProcess::Spawn({"/bin/sh", "-c", "exit 3"}, {}, "");
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  EXPECT_GT(child->pid(), 0);
  ExitInfo exit = WaitExit(*child);
  EXPECT_EQ(exit.code, 3);
  EXPECT_EQ(exit.signal, 0);
  EXPECT_EQ(exit.ToString(), "exited with status 3");
  EXPECT_TRUE(child->reaped());
  EXPECT_TRUE(child->Signal(SIGKILL).ok()) << "signalling a reaped child is a no-op";
}

TEST(Supervisor, KillThroughThePidfd) {
  Result<ChildProcess> child = ChildProcess::Spawn({"sleep", "30"}, {}, "");
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  Result<std::optional<ExitInfo>> not_yet = child->TryReap();
  ASSERT_TRUE(not_yet.ok());
  EXPECT_FALSE(not_yet->has_value());
  ASSERT_TRUE(child->Signal(SIGKILL).ok());
  ExitInfo exit = WaitExit(*child);
  EXPECT_EQ(exit.signal, SIGKILL);
  EXPECT_EQ(exit.ToString(), "killed by SIGKILL");
}

TEST(Supervisor, EnvironmentAndLogFile) {
  const std::string log = "/tmp/baton-supervisor-test-" + std::to_string(::getpid()) + ".log";
  Result<ChildProcess> child =
      ChildProcess::Spawn({"/bin/sh", "-c", "echo token=$BATON_LAUNCH_TOKEN; echo err >&2"},
                          {{"BATON_LAUNCH_TOKEN", "abc"}}, log);
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  EXPECT_EQ(WaitExit(*child).code, 0);
  std::ifstream in(log);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), "token=abc\nerr\n");
  std::remove(log.c_str());
}

// A launch sets BATON_ENGINE_KEYS to the request's keys, and to nothing without keys: one in
// the controller's own environment never reaches an engine.
TEST(Supervisor, ALaunchSetsTheEngineKeysOrClearsThem) {
  const std::string dir = "/tmp/baton-supervisor-keys-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  ::setenv("BATON_ENGINE_KEYS", "inherited-key-0123456789", 1);
  Supervisor supervisor({"/bin/sh", "-c", "echo \"keys=[$BATON_ENGINE_KEYS]\""}, "/s", "/m", "/r",
                        dir);
  for (const auto& [id, keys] : std::vector<std::pair<uint64_t, std::string>>{
           {1, "launch-key-0123456789,next-key-0123456789"}, {2, ""}}) {
    Result<ChildProcess> child =
        supervisor.Launch({.engine_id = id, .token = "t", .engine_keys = keys});
    ASSERT_TRUE(child.ok()) << child.status().ToString();
    EXPECT_EQ(WaitExit(*child).code, 0);
    std::ifstream in(dir + "/engine-" + std::to_string(id) + ".log");
    std::stringstream text;
    text << in.rdbuf();
    EXPECT_EQ(text.str(), "keys=[" + keys + "]\n");
  }
  ::unsetenv("BATON_ENGINE_KEYS");
  std::filesystem::remove_all(dir);
}

TEST(Supervisor, EngineInheritsNoDescriptorButStdio) {
  // A descriptor the controller opened without O_CLOEXEC (as Asio opens its sockets) must not
  // reach an engine: an engine holding a peer's connection keeps it open after the controller
  // closed it. The shell lists the fds it has besides 0, 1 and 2 (its own for the listing
  // aside, it prints nothing when none is inherited).
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const std::string log = "/tmp/baton-supervisor-fds-" + std::to_string(::getpid()) + ".log";
  Result<ChildProcess> child = ChildProcess::Spawn(
      {"/bin/sh", "-c",
       "test -e /proc/self/fd/" + std::to_string(fds[0]) + " && echo leaked; true"},
      {}, log);
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  EXPECT_EQ(WaitExit(*child).code, 0);
  ::close(fds[0]);
  ::close(fds[1]);
  std::ifstream in(log);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), "") << "the engine inherited the controller's fd " << fds[0];
  std::remove(log.c_str());
}

// A command found but that cannot be executed (no #! line, no ELF header): the child exits
// 127, and its exit says what it could not run and why.
TEST(Supervisor, AChildThatCannotExecExitsSayingWhy) {
  const std::string path = "/tmp/baton-supervisor-noexec-" + std::to_string(::getpid());
  {
    std::ofstream out(path);
    out << "not a program\n";
  }
  ASSERT_EQ(::chmod(path.c_str(), 0755), 0);
  Result<ChildProcess> child = ChildProcess::Spawn({path}, {}, "");
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  const ExitInfo exit = WaitExit(*child);
  std::remove(path.c_str());
  EXPECT_EQ(exit.code, 127);
  EXPECT_EQ(exit.ToString(), "could not start: executing engine command " + path +
                                 ": Exec format error (exited with status 127)");
}

TEST(Supervisor, ExecFailureIsAnErrorNamingTheCommand) {
  Result<ChildProcess> missing = ChildProcess::Spawn({"/nonexistent/engine"}, {}, "");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/engine"), std::string::npos)
      << missing.status().ToString();
  Result<ChildProcess> not_on_path = ChildProcess::Spawn({"no-such-engine-xyz"}, {}, "");
  ASSERT_FALSE(not_on_path.ok());
  EXPECT_NE(not_on_path.status().message().find("not on PATH"), std::string::npos);
  EXPECT_FALSE(ChildProcess::Spawn({}, {}, "").ok());
}

TEST(Supervisor, DestructorKillsAndReaps) {
  pid_t pid;
  {
    Result<ChildProcess> child = ChildProcess::Spawn({"sleep", "30"}, {}, "");
    ASSERT_TRUE(child.ok());
    pid = child->pid();
  }
  errno = 0;
  EXPECT_EQ(::kill(pid, 0), -1) << "the child must be gone, not a zombie";
  EXPECT_EQ(errno, ESRCH);
}

TEST(Supervisor, EngineRunsInItsOwnProcessGroup) {
  // Terminal signals (Ctrl-C) reach the controller, which stops the engines in order; the
  // engines die with the controller through PR_SET_PDEATHSIG (see the chaos tests).
  Result<ChildProcess> child = ChildProcess::Spawn({"sleep", "30"}, {}, "");
  ASSERT_TRUE(child.ok());
  std::ifstream status("/proc/" + std::to_string(child->pid()) + "/status");
  std::string line;
  bool found_pgid = false;
  while (std::getline(status, line)) {
    if (line.rfind("NSpgid:", 0) == 0) {
      found_pgid = line.find(std::to_string(child->pid())) != std::string::npos;
    }
  }
  EXPECT_TRUE(found_pgid) << "the engine runs in its own process group";
  child->KillAndReap();
  EXPECT_TRUE(child->reaped());
}

// A previous controller's engine is found again by its pid and start time: signalled like a
// child, its exit seen through the pidfd, a recycled pid refused.
TEST(Supervisor, AdoptFindsTheProcessByPidAndStartTime) {
  Result<ChildProcess> child = ChildProcess::Spawn({"sleep", "30"}, {}, "");
  ASSERT_TRUE(child.ok());
  const uint64_t start = ChildProcess::StartTime(child->pid());
  ASSERT_GT(start, 0u);
  Result<ChildProcess> wrong = ChildProcess::Adopt(child->pid(), start + 1);
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), StatusCode::kNotFound) << wrong.status().ToString();
  EXPECT_NE(wrong.status().message().find("another process"), std::string::npos);

  Result<ChildProcess> adopted = ChildProcess::Adopt(child->pid(), start);
  ASSERT_TRUE(adopted.ok()) << adopted.status().ToString();
  EXPECT_TRUE(adopted->adopted());
  Result<std::optional<ExitInfo>> running = adopted->TryReap();
  ASSERT_TRUE(running.ok() && !running->has_value());
  ASSERT_TRUE(adopted->Signal(SIGKILL).ok());
  pollfd p{.fd = adopted->pidfd(), .events = POLLIN, .revents = 0};
  ASSERT_EQ(::poll(&p, 1, 5000), 1);
  Result<std::optional<ExitInfo>> gone = adopted->TryReap();
  ASSERT_TRUE(gone.ok() && gone->has_value());
  EXPECT_TRUE((*gone)->unknown) << "not our child: how it ended is not known";
  child->KillAndReap();  // the real parent reaps it
  EXPECT_EQ(child->exit_info()->signal, SIGKILL);
  Result<ChildProcess> vanished = ChildProcess::Adopt(child->pid(), start);
  EXPECT_EQ(vanished.status().code(), StatusCode::kNotFound);
}

// A controller that hands its engines over lets them run.
TEST(Supervisor, ReleaseLetsTheProcessRun) {
  pid_t pid = 0;
  {
    Result<ChildProcess> child = ChildProcess::Spawn({"sleep", "30"}, {}, "");
    ASSERT_TRUE(child.ok());
    pid = child->pid();
    child->Release();
  }
  EXPECT_EQ(::kill(pid, 0), 0) << "released, not killed";
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
}

}  // namespace
}  // namespace baton
