// EngineOwning on real processes: an engine's leader, a worker in its process group, a worker
// that left the group (setsid) but descends from the leader, a worker that left both but not
// the engine's cgroup, and processes of no engine.
#include "controller/engines/peer_origin.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/io/unique_fd.h"
#include "base/process/proc_table.h"
#include "controller/engines/child_process.h"
#include "controller/engines/engine_cgroup.h"

namespace baton {
namespace {

class PeerOriginTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("baton-peer-origin-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    for (ChildProcess& c : children_) c.KillAndReap();
    for (pid_t pid : workers_) ::kill(pid, SIGKILL);
    std::filesystem::remove_all(dir_);
  }

  // Starts `script` (`$D` names the test's directory) and returns the process.
  ChildProcess& Start(const std::string& script, SpawnCgroup cgroup = {}) {
    Result<ChildProcess> child =
        ChildProcess::Spawn({"/bin/sh", "-c", script}, {{"D", dir_.string()}}, "", cgroup);
    EXPECT_TRUE(child.ok()) << child.status().ToString();
    children_.push_back(std::move(child).value());
    return children_.back();
  }

  // The pid a script wrote to file `name`, waited for up to 30 s; 0 if it never came.
  pid_t PidFile(const std::string& name) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < until) {
      pid_t pid = 0;
      if (std::ifstream(dir_ / name) >> pid; pid > 0) {
        workers_.push_back(pid);
        return pid;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return 0;
  }

  std::filesystem::path dir_;
  std::deque<ChildProcess> children_;  // stable references
  std::vector<pid_t> workers_;
};

// "sleep & echo" writes the file only after the fork: `$!` is the worker's pid.
constexpr char kTwoWorkers[] =
    "sleep 600 & echo $! > \"$D/in-group.tmp\" && mv \"$D/in-group.tmp\" \"$D/in-group\"; "
    "setsid sleep 600 & echo $! > \"$D/own-session.tmp\" && "
    "mv \"$D/own-session.tmp\" \"$D/own-session\"; wait";

TEST_F(PeerOriginTest, AnEnginesGroupAndDescendantsBelongToIt) {
  ChildProcess& engine = Start(kTwoWorkers);
  ChildProcess& other = Start("exec sleep 600");
  const pid_t in_group = PidFile("in-group");
  const pid_t own_session = PidFile("own-session");
  ASSERT_GT(in_group, 0);
  ASSERT_GT(own_session, 0);
  const std::vector<EngineProcesses> engines = {{.id = 3, .leader = engine.pid(), .cgroup = ""},
                                                {.id = 4, .leader = other.pid(), .cgroup = ""}};
  std::string rule;
  EXPECT_EQ(EngineOwning(engine.pid(), engines, &rule), 3u);
  EXPECT_EQ(EngineOwning(in_group, engines, &rule), 3u);
  EXPECT_EQ(rule, "process group");
  // setsid may still be on its way to its own session: then the group rule places it.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (::getpgid(own_session) != own_session && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(EngineOwning(own_session, engines, &rule), 3u);
  EXPECT_EQ(rule, "descendant");
  EXPECT_EQ(EngineOwning(other.pid(), engines, &rule), 4u);
  EXPECT_EQ(EngineOwning(::getpid(), engines), std::nullopt) << "the test is no engine's";
  EXPECT_EQ(EngineOwning(in_group, {}), std::nullopt);
  const std::vector<EngineProcesses> gone_leader = {{.id = 3, .leader = 0, .cgroup = ""}};
  EXPECT_EQ(EngineOwning(own_session, gone_leader), std::nullopt);
}

TEST_F(PeerOriginTest, AProcessThatIsGoneBelongsToNoEngine) {
  ChildProcess& engine = Start("exit 0");
  const pid_t pid = engine.pid();
  engine.KillAndReap();
  const std::vector<EngineProcesses> engines = {{.id = 1, .leader = pid, .cgroup = ""}};
  EXPECT_EQ(EngineOwning(pid, engines), std::nullopt);
  EXPECT_EQ(EngineOwning(0, engines), std::nullopt);
  EXPECT_EQ(EngineOwning(-1, engines), std::nullopt);
}

// The pidfd tells a process that connected and exited from another that has its pid now.
TEST_F(PeerOriginTest, AConnectedProcessIsGoneOnceItExitedWhoeverHasItsPidNow) {
  ChildProcess& child = Start("exec sleep 600");
  const UniqueFd pidfd(::dup(child.pidfd()));
  ASSERT_TRUE(pidfd);
  EXPECT_FALSE(ConnectedProcessGone(child.pid(), pidfd.get()));
  EXPECT_FALSE(ConnectedProcessGone(child.pid(), -1)) << "no pidfd: /proc alone";
  EXPECT_TRUE(ConnectedProcessGone(0, -1));
  const pid_t pid = child.pid();
  child.KillAndReap();
  EXPECT_TRUE(ConnectedProcessGone(pid, -1));
  EXPECT_TRUE(ConnectedProcessGone(::getpid(), pidfd.get()))
      << "the pid runs (as if given to another process), the pidfd says the first exited";
}

// A worker that left the engine's process group and was orphaned (its parent exited) is
// found by its cgroup alone.
TEST_F(PeerOriginTest, AWorkerThatLeftGroupAndParentIsFoundByItsCgroup) {
  std::string why_not;
  Result<std::unique_ptr<EngineCgroups>> cgroups =
      EngineCgroups::Open("auto", "/peer-origin-test-" + std::to_string(::getpid()), &why_not);
  ASSERT_TRUE(cgroups.ok()) << cgroups.status().ToString();
  if (*cgroups == nullptr) GTEST_SKIP() << "no engine cgroups on this machine: " << why_not;
  Result<std::shared_ptr<EngineCgroup>> cg = (*cgroups)->Create(7);
  ASSERT_TRUE(cg.ok()) << cg.status().ToString();
  ChildProcess& engine = Start(
      "(setsid sleep 600 & echo $! > \"$D/orphan.tmp\" && mv \"$D/orphan.tmp\" \"$D/orphan\"); "
      "exec sleep 600",
      (*cg)->spawn_target());
  const pid_t orphan = PidFile("orphan");
  ASSERT_GT(orphan, 0);
  // The subshell that started it may still be exiting: wait until the worker leads its own
  // session and no longer descends from the engine.
  const auto orphaned = [&] {
    const std::vector<pid_t> up = Ancestors(orphan);
    return ::getpgid(orphan) == orphan && std::find(up.begin(), up.end(), engine.pid()) == up.end();
  };
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!orphaned() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(orphaned());
  std::vector<EngineProcesses> engines = {
      {.id = 7, .leader = engine.pid(), .cgroup = (*cg)->path()}};
  std::string rule;
  EXPECT_EQ(EngineOwning(orphan, engines, &rule), 7u);
  EXPECT_EQ(rule, "cgroup");
  EXPECT_EQ(EngineOwning(::getpid(), engines), std::nullopt) << "the test is no engine's";
  engines[0].cgroup.clear();
  EXPECT_EQ(EngineOwning(orphan, engines), std::nullopt)
      << "out of the engine's group, orphaned: only the cgroup tells";
  engines[0].cgroup = (*cg)->path() + "-other";
  EXPECT_EQ(EngineOwning(orphan, engines), std::nullopt) << "a name prefix is no parent";
  ASSERT_TRUE((*cg)->Kill().ok());
}

}  // namespace
}  // namespace baton
