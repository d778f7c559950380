// RunGuard and the /proc helpers: a process the run started, detached from it on purpose (its
// own session, re-parented away, as baton-keeper is), is gone once the run ends, whether the
// run exits, is stopped by SIGINT or is killed with kill -9; a process of another run is
// never touched. Each run here is a forked child of the test that installs its own guard.
#include "base/process/run_guard.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>

#include "base/process/proc_table.h"

namespace baton {
namespace {

bool GoneWithin(pid_t pid, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (ProcessRunning(pid) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return !ProcessRunning(pid);
}

// Waits until `pid` has exec'd with `token` in its start environment (before its execve,
// /proc/PID/environ still shows its parent's start environment), at most 10 s.
bool CarriesTokenWithin(pid_t pid, const std::string& token) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (true) {
    const std::optional<std::string> value = StartEnvironValue(pid, kRunGuardVariable);
    if (value.has_value() && HasToken(*value, token)) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// Starts `sleep 600` detached from the caller (a session of its own, its parent gone at once:
// init or the nearest subreaper adopts it); its pid.
pid_t StartDetachedSleeper() {
  int fds[2];
  if (::pipe(fds) != 0) return -1;
  const pid_t child = ::fork();
  if (child == 0) {
    ::setsid();
    const pid_t grandchild = ::fork();
    if (grandchild == 0) {
      ::close(fds[0]);
      ::close(fds[1]);
      ::execl("/bin/sleep", "sleep", "600", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    (void)!::write(fds[1], &grandchild, sizeof(grandchild));
    ::_exit(0);
  }
  ::close(fds[1]);
  pid_t pid = -1;
  if (::read(fds[0], &pid, sizeof(pid)) != sizeof(pid)) pid = -1;
  ::close(fds[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  return pid;
}

enum class End { kExit, kWait };

// Forks a run: it installs a guard, starts a detached sleeper, waits until the sleeper has
// exec'd with the run's token (a sweep cannot see a process that has not), reports its pid on
// a pipe, then exits (kExit) or waits to be signalled (kWait). The run's pid and the
// sleeper's (-1 when it did not start).
std::pair<pid_t, pid_t> StartRun(End end, const std::string& folder = "") {
  int fds[2];
  if (::pipe(fds) != 0) return {-1, -1};
  const pid_t run = ::fork();
  if (run == 0) {
    ::close(fds[0]);
    ::signal(SIGINT, SIG_DFL);
    if (!RunGuard::Install("run-guard-test").ok()) ::_exit(3);
    RunGuard::RemoveIfInterrupted(folder);
    pid_t sleeper = StartDetachedSleeper();
    if (sleeper > 0 && !CarriesTokenWithin(sleeper, RunGuard::token())) {
      ::kill(sleeper, SIGKILL);
      sleeper = -1;
    }
    (void)!::write(fds[1], &sleeper, sizeof(sleeper));
    ::close(fds[1]);
    if (end == End::kExit) std::exit(0);
    while (true) ::pause();
  }
  ::close(fds[1]);
  pid_t sleeper = -1;
  if (::read(fds[0], &sleeper, sizeof(sleeper)) != sizeof(sleeper)) sleeper = -1;
  ::close(fds[0]);
  return {run, sleeper};
}

// Kills the run's sleeper should it outlive the test (a failed check), so that it does not
// stay 600 s. Only while it still carries the run's token: its pid may be another's by then.
class SleeperKiller {
 public:
  SleeperKiller(pid_t run, pid_t sleeper)
      : sleeper_(sleeper), token_prefix_("run-guard-test." + std::to_string(run) + ".") {}
  SleeperKiller(const SleeperKiller&) = delete;
  SleeperKiller& operator=(const SleeperKiller&) = delete;
  ~SleeperKiller() {
    if (sleeper_ <= 0) return;
    const std::optional<std::string> value = StartEnvironValue(sleeper_, kRunGuardVariable);
    if (value.has_value() && value->find(token_prefix_) != std::string::npos) {
      ::kill(sleeper_, SIGKILL);
    }
  }

 private:
  const pid_t sleeper_;
  const std::string token_prefix_;
};

// A scratch folder the run registered stays when the run ends by exit() (its own code
// removes it, or keeps it on purpose), and is removed when the run is interrupted.
TEST(RunGuardTest, ARegisteredFolderGoesOnlyWithAnInterruptedRun) {
  for (const End end : {End::kExit, End::kWait}) {
    char tmpl[] = "/tmp/baton-run-guard-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    const std::string folder = tmpl;
    std::ofstream(folder + "/file") << "scratch\n";
    const auto [run, sleeper] = StartRun(end, folder);
    const SleeperKiller killer(run, sleeper);
    ASSERT_GT(sleeper, 0);
    if (end == End::kWait) {
      ASSERT_EQ(::kill(run, SIGINT), 0);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(run, &status, 0), run);
    EXPECT_EQ(std::filesystem::exists(folder + "/file"), end == End::kExit) << folder;
    std::filesystem::remove_all(folder);
  }
}

TEST(RunGuardTest, ADetachedProcessIsGoneWhenTheRunExits) {
  const auto [run, sleeper] = StartRun(End::kExit);
  const SleeperKiller killer(run, sleeper);
  ASSERT_GT(sleeper, 0);
  int status = 0;
  ASSERT_EQ(::waitpid(run, &status, 0), run);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_FALSE(ProcessRunning(sleeper)) << "the run waited for the sweep before it ended";
}

TEST(RunGuardTest, ADetachedProcessIsGoneWhenTheRunIsInterrupted) {
  const auto [run, sleeper] = StartRun(End::kWait);
  const SleeperKiller killer(run, sleeper);
  ASSERT_GT(sleeper, 0);
  ASSERT_TRUE(ProcessRunning(sleeper));
  ASSERT_EQ(::kill(run, SIGINT), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(run, &status, 0), run);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGINT) << "it dies of the signal";
  EXPECT_FALSE(ProcessRunning(sleeper)) << "the run waited for the sweep before it ended";
}

TEST(RunGuardTest, ADetachedProcessIsGoneWhenTheRunIsKilled) {
  const auto [run, sleeper] = StartRun(End::kWait);
  const SleeperKiller killer(run, sleeper);
  ASSERT_GT(sleeper, 0);
  ASSERT_EQ(::kill(run, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(run, &status, 0), run);
  EXPECT_TRUE(GoneWithin(sleeper, RunGuard::kSweepLimit)) << "the reaper swept after the kill";
}

TEST(RunGuardTest, AProcessOfAnotherRunIsNotTouched) {
  const pid_t other = ::fork();
  if (other == 0) {
    ::setenv(kRunGuardVariable, "another-run.1.0", 1);
    ::execl("/bin/sleep", "sleep", "600", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ASSERT_GT(other, 0);
  // Killed whatever happens below, so that a miss fails at once instead of waiting on it.
  struct Killer {
    pid_t pid;
    ~Killer() {
      if (pid <= 0) return;
      ::kill(pid, SIGKILL);
      int status = 0;
      ::waitpid(pid, &status, 0);
    }
  } killer{other};
  EXPECT_TRUE(CarriesTokenWithin(other, "another-run.1.0")) << "it exec'd";
  EXPECT_EQ(KillTaggedProcesses("another-run.1", std::chrono::seconds(1)), 0) << "a prefix";
  EXPECT_EQ(KillTaggedProcesses("mine.1.0", std::chrono::seconds(1)), 0);
  EXPECT_TRUE(ProcessRunning(other));
  EXPECT_EQ(KillTaggedProcesses("another-run.1.0", std::chrono::seconds(1)), 1);  // our zombie
  ::kill(other, SIGKILL);  // killed already unless the sweep missed it
  killer.pid = -1;
  int status = 0;
  ASSERT_EQ(::waitpid(other, &status, 0), other);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
}

TEST(ProcTableTest, TokensAndTheStartEnvironment) {
  EXPECT_TRUE(HasToken("a:b.1:c", "b.1"));
  EXPECT_TRUE(HasToken("a", "a"));
  EXPECT_FALSE(HasToken("a:b.12", "b.1"));
  EXPECT_FALSE(HasToken("", ""));
  // This process was started with PATH; a variable set since is not in /proc/PID/environ.
  EXPECT_TRUE(StartEnvironValue(::getpid(), "PATH").has_value());
  ::setenv("BATON_PROC_TABLE_TEST", "x", 1);
  EXPECT_FALSE(StartEnvironValue(::getpid(), "BATON_PROC_TABLE_TEST").has_value());
  const std::vector<pid_t> up = Ancestors(::getpid());
  ASSERT_FALSE(up.empty());
  EXPECT_EQ(up.front(), ::getppid());
  EXPECT_FALSE(ProcessName(::getpid()).empty());
}

// The program a process runs, as installed: a file replaced (here removed) while it runs is
// still named by its path, without the kernel's " (deleted)".
TEST(ProcTableTest, TheProgramIsItsPathEvenOnceTheFileIsGone) {
  EXPECT_EQ(ProcessProgram(::getpid()), std::filesystem::canonical("/proc/self/exe").string());
  EXPECT_EQ(ProcessProgram(0), "");
  char dir[] = "/tmp/baton-program-test-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string copy = std::string(dir) + "/sleeper";
  std::filesystem::copy_file(std::filesystem::canonical("/bin/sleep"), copy);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::execl(copy.c_str(), copy.c_str(), "30", nullptr);
    ::_exit(127);
  }
  for (int i = 0; i < 2000 && ProcessProgram(child) != copy; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // until it exec'd
  }
  EXPECT_EQ(ProcessProgram(child), copy);
  std::filesystem::remove_all(dir);
  EXPECT_EQ(ProcessProgram(child), copy) << "not '" << copy << " (deleted)'";
  ::kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_EQ(ProcessProgram(child), "") << "gone";
}

TEST(ProcTableTest, StatNamesTheParentAndTheProcessGroup) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::setpgid(0, 0);
    ::pause();
    ::_exit(0);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  std::optional<ProcStat> stat = ReadProcStat(child);
  while (stat.has_value() && stat->pgid != child && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    stat = ReadProcStat(child);
  }
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  ASSERT_TRUE(stat.has_value());
  EXPECT_EQ(stat->ppid, ::getpid());
  EXPECT_EQ(stat->pgid, child) << "the child leads a group of its own";
  EXPECT_EQ(ReadProcStat(::getpid())->pgid, ::getpgrp());
  EXPECT_GT(stat->start_ticks, 0u);
}

}  // namespace
}  // namespace baton
