// Real cgroup v2 directories and real processes. The tests that need cgroups are skipped,
// with the reason, where this machine gives none (no cgroup2 mount, no permission, a kernel
// without cgroup.kill).
#include "controller/engines/engine_cgroup.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <thread>

#include "base/process/proc_table.h"
#include "controller/engines/child_process.h"

namespace baton {
namespace {

// Polls `done` every 10 ms for up to 30 s (a loaded machine may be slow to run an exit).
template <typename F>
bool Eventually(F done) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < until) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

std::string TestKey() {
  return "/engine-cgroup-test-" + std::to_string(::getpid()) + "-" +
         ::testing::UnitTest::GetInstance()->current_test_info()->name();
}

class EngineCgroupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why_not;
    Result<std::unique_ptr<EngineCgroups>> c = EngineCgroups::Open("auto", TestKey(), &why_not);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    if (*c == nullptr) GTEST_SKIP() << "no engine cgroups on this machine: " << why_not;
    cgroups_ = std::move(c).value();
  }

  // An engine in cgroup `id` (cg_, child_) that started a worker with setsid; returns once
  // both are members.
  void StartEngineWithEscapedWorker(uint64_t id) {
    Result<std::shared_ptr<EngineCgroup>> cg = cgroups_->Create(id);
    ASSERT_TRUE(cg.ok()) << cg.status().ToString();
    cg_ = std::move(cg).value();
    Result<ChildProcess> child = ChildProcess::Spawn(
        {"/bin/sh", "-c", "setsid sleep 600 & exec sleep 600"}, {}, "", cg_->spawn_target());
    ASSERT_TRUE(child.ok()) << child.status().ToString();
    child_.emplace(std::move(child).value());
    ASSERT_TRUE(Eventually([&] { return cg_->Members().size() == 2; }));
  }

  std::unique_ptr<EngineCgroups> cgroups_;
  std::shared_ptr<EngineCgroup> cg_;
  std::optional<ChildProcess> child_;
};

TEST(EngineCgroupSettingTest, OffAndBadSettings) {
  std::string why_not;
  Result<std::unique_ptr<EngineCgroups>> off = EngineCgroups::Open("off", "/run/x", &why_not);
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(*off, nullptr);
  Result<std::unique_ptr<EngineCgroups>> relative = EngineCgroups::Open("baton", "/x", &why_not);
  ASSERT_FALSE(relative.ok());
  EXPECT_NE(relative.status().message().find("absolute path"), std::string::npos)
      << relative.status().ToString();
  // A configured directory must work: no silent fallback to process groups.
  Result<std::unique_ptr<EngineCgroups>> missing =
      EngineCgroups::Open("/nonexistent-baton-dir/engines", "/x", &why_not);
  EXPECT_FALSE(missing.ok());
}

// A child that cannot join its cgroup through cgroup.procs never runs its command: it exits
// 127 saying why.
TEST(EngineCgroupSettingTest, AChildThatCannotJoinItsCgroupIsAnError) {
  UniqueFd read_only(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(read_only);
  Result<ChildProcess> child =
      ChildProcess::Spawn({"sleep", "30"}, {}, "", SpawnCgroup{.procs_fd = read_only.get()});
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  ASSERT_TRUE(Eventually([&] {
    Result<std::optional<ExitInfo>> exit = child->TryReap();
    return exit.ok() && exit->has_value();
  }));
  EXPECT_EQ(child->exit_info()->code, 127);
  EXPECT_NE(child->exit_info()->ToString().find("could not start: joining the engine's cgroup"),
            std::string::npos)
      << child->exit_info()->ToString();
  // A directory that is no cgroup: the child is not made, nor made elsewhere.
  UniqueFd not_a_cgroup(::open("/tmp", O_PATH | O_DIRECTORY | O_CLOEXEC));
  ASSERT_TRUE(not_a_cgroup);
  child = ChildProcess::Spawn({"sleep", "30"}, {}, "", SpawnCgroup{.dir_fd = not_a_cgroup.get()});
  ASSERT_FALSE(child.ok());
  EXPECT_NE(child.status().message().find("joining the engine's cgroup"), std::string::npos)
      << child.status().ToString();
}

// The child is made in its cgroup (clone3 with CLONE_INTO_CGROUP): no write to cgroup.procs,
// which would stall the controller's event loop for a grace period of RCU.
TEST_F(EngineCgroupTest, AChildIsMadeInItsCgroupWithoutAMigration) {
  Result<std::shared_ptr<EngineCgroup>> cg = cgroups_->Create(4);
  ASSERT_TRUE(cg.ok()) << cg.status().ToString();
  const SpawnCgroup dir_only{.dir_fd = (*cg)->spawn_target().dir_fd};
  ASSERT_GE(dir_only.dir_fd, 0);
  Result<ChildProcess> child = ChildProcess::Spawn({"sleep", "600"}, {}, "", dir_only);
  if (!child.ok() &&
      child.status().message().find("Function not implemented") != std::string::npos) {
    GTEST_SKIP() << "a kernel without clone3: " << child.status().ToString();
  }
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  EXPECT_EQ((*cg)->Members(), std::vector<pid_t>{child->pid()});
  child->KillAndReap();
}

// Spawn returns without waiting for the child to run: here it never can, made in a frozen
// cgroup (as a child waits for a CPU on a loaded host, with the controller's loop waiting
// on it were it to wait).
TEST_F(EngineCgroupTest, SpawnDoesNotWaitForTheChildToRun) {
  Result<std::shared_ptr<EngineCgroup>> cg = cgroups_->Create(5);
  ASSERT_TRUE(cg.ok()) << cg.status().ToString();
  ASSERT_TRUE((*cg)->Freeze().ok());
  const SpawnCgroup dir_only{.dir_fd = (*cg)->spawn_target().dir_fd};
  Result<ChildProcess> child = ChildProcess::Spawn({"sleep", "600"}, {}, "", dir_only);
  if (!child.ok() &&
      child.status().message().find("Function not implemented") != std::string::npos) {
    GTEST_SKIP() << "a kernel without clone3: " << child.status().ToString();
  }
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  EXPECT_TRUE(Eventually([&] { return (*cg)->Frozen(); }));
  EXPECT_EQ((*cg)->Members(), std::vector<pid_t>{child->pid()});
  child->KillAndReap();  // SIGKILL ends a frozen process
  EXPECT_TRUE(child->reaped());
}

// The escape a process group cannot see: a worker that called setsid. The cgroup holds it,
// and one write to cgroup.kill ends it with the engine.
TEST_F(EngineCgroupTest, AProcessThatLeftItsGroupIsKilledWithTheCgroup) {
  ASSERT_NO_FATAL_FAILURE(StartEngineWithEscapedWorker(1));
  pid_t escaped = 0;
  for (pid_t pid : cg_->Members()) {
    if (pid != child_->pid()) escaped = pid;
  }
  ASSERT_NE(escaped, 0);
  EXPECT_TRUE(Eventually([&] { return ::getpgid(escaped) == escaped; }))
      << "the worker leads a session of its own, out of the engine's process group";
  EXPECT_TRUE(cg_->Populated());

  ASSERT_TRUE(cg_->Kill().ok());
  child_->KillAndReap();
  EXPECT_TRUE(Eventually([&] { return !cg_->Populated(); }));
  EXPECT_FALSE(ProcessRunning(escaped));
  EXPECT_TRUE(cg_->Members().empty());
  const std::string path = cg_->path();
  cg_.reset();
  EXPECT_NE(::access(path.c_str(), F_OK), 0) << "the cgroup is removed with its owner";
}

// The hang drill freezes the cgroup: the worker that left the engine's group stops too, and
// the fence's cgroup.kill still ends every frozen member.
TEST_F(EngineCgroupTest, AFrozenCgroupStopsEveryMemberAndIsStillKilled) {
  ASSERT_NO_FATAL_FAILURE(StartEngineWithEscapedWorker(3));
  const std::vector<pid_t> members = cg_->Members();
  EXPECT_FALSE(cg_->Frozen());

  ASSERT_TRUE(cg_->Freeze().ok());
  EXPECT_TRUE(Eventually([&] { return cg_->Frozen(); })) << "every member stops";

  ASSERT_TRUE(cg_->Kill().ok());
  child_->KillAndReap();
  EXPECT_TRUE(Eventually([&] { return !cg_->Populated(); }));
  for (pid_t pid : members) EXPECT_FALSE(ProcessRunning(pid)) << pid;
}

// The CPU time of every process that ran in the cgroup, those that exited included.
TEST_F(EngineCgroupTest, CpuTimeCountsEveryProcessTheDeadIncluded) {
  Result<std::shared_ptr<EngineCgroup>> cg = cgroups_->Create(2);
  ASSERT_TRUE(cg.ok()) << cg.status().ToString();
  EXPECT_EQ((*cg)->CpuSeconds(), 0.0) << "nothing ran in it yet";
  Result<ChildProcess> child =
      ChildProcess::Spawn({"/bin/sh", "-c", "i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done"},
                          {}, "", (*cg)->spawn_target());
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  ASSERT_TRUE(Eventually([&] { return !(*cg)->Populated(); }));
  child->KillAndReap();
  EXPECT_EQ(child->exit_info()->code, 0);
  EXPECT_GT((*cg)->CpuSeconds(), 0.0);
}

// A controller that died left processes in its engines' cgroups (its engines died with it;
// what they started did not). The next controller of the same runtime directory kills them.
TEST_F(EngineCgroupTest, LeftoversOfAnEarlierControllerAreKilled) {
  const std::string leftover = cgroups_->base() + "/engine-9";
  ASSERT_EQ(::mkdir(leftover.c_str(), 0755), 0);
  UniqueFd procs(::open((leftover + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC));
  ASSERT_TRUE(procs);
  Result<ChildProcess> child =
      ChildProcess::Spawn({"sleep", "600"}, {}, "", SpawnCgroup{.procs_fd = procs.get()});
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  ASSERT_TRUE(Eventually([&] {  // it moves itself there once it runs
    std::ifstream members(leftover + "/cgroup.procs");
    for (pid_t pid; members >> pid;) {
      if (pid == child->pid()) return true;
    }
    return false;
  }));

  std::string why_not;
  Result<std::unique_ptr<EngineCgroups>> next = EngineCgroups::Open("auto", TestKey(), &why_not);
  ASSERT_TRUE(next.ok() && *next != nullptr) << why_not;
  EXPECT_EQ((*next)->base(), cgroups_->base()) << "the same runtime directory, the same base";
  EXPECT_EQ(::access(leftover.c_str(), F_OK), 0) << "opening touches no leftover";
  (*next)->ClearLeftovers({9});  // a re-adopted engine's cgroup stays
  EXPECT_EQ((*next)->leftovers_killed(), 0u);
  EXPECT_EQ(::access(leftover.c_str(), F_OK), 0);
  Result<std::optional<ExitInfo>> running = child->TryReap();
  ASSERT_TRUE(running.ok() && !running->has_value()) << "the re-adopted engine runs on";
  (*next)->ClearLeftovers({});
  EXPECT_EQ((*next)->leftovers_killed(), 1u);
  EXPECT_NE(::access(leftover.c_str(), F_OK), 0);
  child->KillAndReap();
  EXPECT_EQ(child->exit_info()->signal, SIGKILL);
}

// Letting a cgroup go never waits: one that cannot be removed yet (here a cgroup below it, as
// members still exiting would) is kept and removed by a later sweep, or given up after
// kMaxSweeps and left for the next start.
TEST_F(EngineCgroupTest, ACgroupThatCannotBeRemovedYetIsRemovedByALaterSweep) {
  for (uint64_t id : {5, 6}) {
    Result<std::shared_ptr<EngineCgroup>> cg = cgroups_->Create(id);
    ASSERT_TRUE(cg.ok()) << cg.status().ToString();
    const std::string path = (*cg)->path();
    ASSERT_EQ(::mkdir((path + "/busy").c_str(), 0755), 0) << std::strerror(errno);
    cg = NotFound("released");  // the engine's handle goes
    EXPECT_EQ(::access(path.c_str(), F_OK), 0) << "kept while it cannot be removed";
    EXPECT_EQ(cgroups_->retired().pending(), 1u);
    EXPECT_EQ(cgroups_->retired().Sweep(), 1u);
    if (id == 5) {
      ASSERT_EQ(::rmdir((path + "/busy").c_str()), 0);
      EXPECT_EQ(cgroups_->retired().Sweep(), 0u);
      EXPECT_NE(::access(path.c_str(), F_OK), 0) << "removed by the sweep once it could be";
    } else {
      for (int i = 1; i < RetiredCgroups::kMaxSweeps; ++i) cgroups_->retired().Sweep();
      EXPECT_EQ(cgroups_->retired().pending(), 0u) << "given up";
      EXPECT_EQ(::access(path.c_str(), F_OK), 0);
      ::rmdir((path + "/busy").c_str());
      ::rmdir(path.c_str());
    }
  }
}

// A controller that stops while an engine's cgroup is still held (its handle outlives the
// EngineCgroups) leaves nothing behind: the base goes once that cgroup has.
TEST_F(EngineCgroupTest, TheBaseIsRemovedAfterTheLastEngineCgroup) {
  Result<std::shared_ptr<EngineCgroup>> held = cgroups_->Create(4);
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  Result<ChildProcess> child =
      ChildProcess::Spawn({"sleep", "600"}, {}, "", (*held)->spawn_target());
  ASSERT_TRUE(child.ok());
  const std::string base = cgroups_->base();
  cgroups_.reset();
  EXPECT_TRUE(std::filesystem::exists(base)) << "its engine cgroup is still held";
  // Its member gone first: the last removals wait only 200 ms for a killed member's exit,
  // which a loaded machine may not run in time (killing with the cgroup is tested above).
  child->KillAndReap();
  held->reset();  // removed, and the base after it
  EXPECT_FALSE(std::filesystem::exists(base + "/engine-4"));
  EXPECT_FALSE(std::filesystem::exists(base)) << "an empty base left behind";
}

TEST_F(EngineCgroupTest, CreateReplacesAStaleCgroupOfTheSameName) {
  Result<std::shared_ptr<EngineCgroup>> first = cgroups_->Create(3);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  Result<ChildProcess> child =
      ChildProcess::Spawn({"sleep", "600"}, {}, "", (*first)->spawn_target());
  ASSERT_TRUE(child.ok());
  Result<std::shared_ptr<EngineCgroup>> second = cgroups_->Create(3);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  child->KillAndReap();
  EXPECT_EQ(child->exit_info()->signal, SIGKILL) << "the stale cgroup's member was killed";
  EXPECT_FALSE((*second)->Populated());
}

// A base removed under a running controller (a tool that prunes empty cgroups) is made again
// at the next launch: engines still launch.
TEST_F(EngineCgroupTest, ABaseRemovedWhileItRanIsMadeAgain) {
  const std::string base = cgroups_->base();
  ASSERT_EQ(::rmdir(base.c_str()), 0) << std::strerror(errno);
  Result<std::shared_ptr<EngineCgroup>> made = cgroups_->Create(5);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  EXPECT_TRUE(std::filesystem::exists(base + "/engine-5"));
  made->reset();
}

}  // namespace
}  // namespace baton
