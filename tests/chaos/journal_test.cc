// Chaos drills of the epoch journal: epochs across a controller's restart, and a real
// controller whose journal cannot be written when a primary dies. The journal's temporary file
// is made a directory, so every write fails (EISDIR) until the directory is removed, as a full
// or read-only disk would make it fail. With `controller.epoch_reserve = 1` no epoch is
// reserved ahead, so the fence itself needs a write: the failure lands on the failover path.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <thread>

#include "tests/chaos/chaos_harness.h"

namespace baton::chaos {
namespace {

size_t Occurrences(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

bool Contains(const json& ids, uint64_t id) {
  for (const json& x : ids) {
    if (x.get<uint64_t>() == id) return true;
  }
  return false;
}

TEST(ChaosJournal, AReapedPrimaryWaitsForADurableEpochAndItsBlocksMoveOnceThereIsOne) {
  ClusterOptions options;
  options.epoch_reserve = 1;
  ChaosCluster cluster(options);
  const json before = cluster.Status();
  EXPECT_EQ(before["epoch"]["reserve_batch"], 1);
  EXPECT_TRUE(before["epoch"]["journal_error"].is_null());
  const json primary = EngineWithRole(before, "primary");
  const json standby = EngineWithRole(before, "standby");
  ASSERT_FALSE(primary.is_null());
  ASSERT_FALSE(standby.is_null());
  const uint64_t old_id = primary["id"].get<uint64_t>();

  const std::string tmp = cluster.dir() + "/run/state/epoch.journal.tmp";
  ASSERT_EQ(::mkdir(tmp.c_str(), 0700), 0) << tmp;
  ASSERT_EQ(::kill(PidOf(primary), SIGKILL), 0);
  const json held = cluster.WaitFor(
      [&](const json& s) {
        return !s["epoch"]["journal_error"].is_null() &&
               Contains(s["epoch"]["unfenced_reaped"], old_id);
      },
      "the reaped primary to wait for a durable epoch");
  EXPECT_FALSE(ProcessExists(PidOf(primary)));
  EXPECT_TRUE(EngineWithRole(held, "primary").is_null()) << "nothing is promoted meanwhile";
  EXPECT_NE(held["epoch"]["journal_error"].get<std::string>().find("epoch.journal.tmp"),
            std::string::npos)
      << held["epoch"].dump();
  EXPECT_GE(held["epoch"]["journal_write_failures"].get<uint64_t>(), 1u);
  EXPECT_EQ(held["epoch"]["durable"], before["epoch"]["durable"]) << "no epoch was made durable";
  const CtlResult plain = cluster.CtlPlain({"status"});
  EXPECT_NE(plain.stdout_text.find("epoch journal: CANNOT WRITE"), std::string::npos)
      << plain.stdout_text;
  EXPECT_NE(plain.stdout_text.find("new epochs are held"), std::string::npos) << plain.stdout_text;
  EXPECT_NE(plain.stdout_text.find("engine " + std::to_string(old_id) + " waits to be fenced"),
            std::string::npos)
      << plain.stdout_text;

  // The fence is retried (once a second), and fails again: the blocks still wait.
  const uint64_t failures = held["epoch"]["journal_write_failures"].get<uint64_t>();
  const json still = cluster.WaitFor(
      [&](const json& s) {
        return s["epoch"]["journal_write_failures"].get<uint64_t>() > failures;
      },
      "the fence to be retried");
  EXPECT_TRUE(EngineWithRole(still, "primary").is_null());
  EXPECT_TRUE(Contains(still["epoch"]["unfenced_reaped"], old_id));

  ASSERT_EQ(::rmdir(tmp.c_str()), 0);
  const json after =
      cluster.WaitFor([&](const json& s) { return IsReady(s) && PrimaryId(s) != old_id; },
                      "the standby to take over once the journal can be written");
  EXPECT_EQ(PrimaryId(after), standby["id"].get<uint64_t>()) << "the standby was promoted";
  EXPECT_TRUE(after["epoch"]["journal_error"].is_null());
  EXPECT_TRUE(after["epoch"]["unfenced_reaped"].empty());
  EXPECT_GT(Epoch(after), Epoch(before));
  EXPECT_EQ(after["pool"]["quarantined"], 0);
  EXPECT_NE(cluster.Log().find("reaped engine " + std::to_string(old_id) + " fenced at epoch"),
            std::string::npos);
  EXPECT_EQ(Occurrences(cluster.Log(), "epoch journal can be written again"), 1u)
      << "one log line for the change";
  cluster.CheckFencing();
}

// With a batch of 2 the fence finds its epoch reserved, but with both engines gone the
// promotion of the next standby needs a write: it is held, and retried, until the journal can
// be written. The crash-loop guard trips at each failure, so that no replacement standby
// registers before the primary's fence (it would be promoted at the reserved epoch).
TEST(ChaosJournal, APromotionThatFindsNoDurableEpochWaitsForOne) {
  ClusterOptions options;
  options.epoch_reserve = 2;
  options.max_failures = 1;
  options.initial_backoff_ms = 1000;
  ChaosCluster cluster(options);
  const json before = cluster.WaitFor(
      [](const json& s) { return IsReady(s) && s["epoch"]["reserved"].get<uint64_t>() > Epoch(s); },
      "an epoch reserved ahead");
  const json primary = EngineWithRole(before, "primary");
  const json standby = EngineWithRole(before, "standby");
  ASSERT_FALSE(primary.is_null());
  ASSERT_FALSE(standby.is_null());

  const std::string tmp = cluster.dir() + "/run/state/epoch.journal.tmp";
  ASSERT_EQ(::mkdir(tmp.c_str(), 0700), 0) << tmp;
  ASSERT_EQ(::kill(PidOf(standby), SIGKILL), 0);
  cluster.WaitFor([](const json& s) { return EngineWithRole(s, "standby").is_null(); },
                  "the standby's death to be seen");
  ASSERT_EQ(::kill(PidOf(primary), SIGKILL), 0);
  const json held = cluster.WaitFor(
      [&](const json& s) {
        return !s["epoch"]["journal_error"].is_null() && !EngineWithRole(s, "standby").is_null();
      },
      "a new standby, and a promotion that cannot get an epoch");
  EXPECT_TRUE(EngineWithRole(held, "primary").is_null());
  EXPECT_TRUE(held["epoch"]["unfenced_reaped"].empty()) << "the fence found its epoch reserved";
  EXPECT_EQ(held["epoch"]["reserved"], held["epoch"]["durable"]) << "the reservation is used up";
  const CtlResult plain = cluster.CtlPlain({"status"});
  EXPECT_NE(plain.stdout_text.find("new epochs are held"), std::string::npos) << plain.stdout_text;

  ASSERT_EQ(::rmdir(tmp.c_str()), 0);
  const json after = cluster.WaitFor(
      [&](const json& s) {
        return IsReady(s) && PrimaryId(s) != primary["id"] && PrimaryId(s) != standby["id"];
      },
      "the new standby to be promoted once the journal can be written");
  EXPECT_TRUE(after["epoch"]["journal_error"].is_null());
  EXPECT_EQ(Occurrences(cluster.Log(), "epoch journal can be written again"), 1u);
  EXPECT_GT(Epoch(after), Epoch(before));
  cluster.CheckFencing();
}

// Epochs continue across a restart even when nothing survives it: the engines gone with
// the controller, the restarted one fences them and promotes at an epoch above the
// reservation the old one made.
TEST(ChaosJournal, EpochsSurviveARestartThatFindsNoEngine) {
  ChaosCluster cluster;
  ASSERT_EQ(cluster.Ctl({"drill", "kill"}).exit_code, 0);  // move the epoch past 1
  const json before = cluster.WaitFor(
      [](const json& s) { return IsReady(s) && s["epoch"]["durable"].get<uint64_t>() >= 2; },
      "a failover");
  cluster.KillController();
  for (const json& e : before["engines"]) ::kill(PidOf(e), SIGKILL);
  cluster.RestartController();
  const json after = cluster.Status();
  EXPECT_GT(Epoch(after), Epoch(before)) << "rule 3: epochs never go back across restarts";
  EXPECT_GT(EngineWithRole(after, "primary")["epoch"].get<uint64_t>(),
            before["epoch"]["reserved"].get<uint64_t>())
      << "the new primary's epoch is above everything the old controller may have issued";
  cluster.CheckFencing();
}

}  // namespace
}  // namespace baton::chaos
