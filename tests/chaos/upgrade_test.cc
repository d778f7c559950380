// Canary upgrades of a real pair of reference engines behind baton-router, under load.
//
//  * `batonctl upgrade` to a new engine command (the reference engine reporting another
//    version) walks the canary through its steps and promotes it; `batonctl rollback` then
//    canaries the previous command back. Every request sent meanwhile gets 200 and the output
//    of its reference.
//  * A broken build (every completion answered 500) is rolled back on its error rate; the
//    router retries what the canary failed on the primary, so no client sees an error.
//  * A build whose outputs differ from the primary's (its sampling changed) is rolled back
//    on the routers' shadow comparison.
//  * A canary killed with kill -9 mid-canary is rolled back; its requests are replayed. A
//    primary killed mid-canary hands the service to the canary.
//  * batonctl's refusals: no command, a program that is not there, one upgrade at a time,
//    nothing to roll back, no switch-over during an upgrade; a candidate that cannot start
//    is rolled back.
#include <gtest/gtest.h>
#include <signal.h>

#include <string>
#include <thread>
#include <vector>

#include "tests/chaos/chaos_harness.h"
#include "tests/chaos/router_load.h"
#include "tests/chaos/router_stream_support.h"
#include "tests/chaos/upgrade_support.h"

namespace baton::chaos {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

std::string EngineSeries(const char* what, uint64_t engine) {
  return std::string("baton_router_engine_") + what + "_total{engine_id=\"" +
         std::to_string(engine) + "\"}";
}

class UpgradeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(router_.ready()) << router_.Log();
    References(router_.port(), "Upgrade", 32, &requests_, &want_);
  }

  ChaosCluster cluster_{TolerantHealth(RefenginePair())};  // no failover may come of the load
  RouterProcess router_{cluster_.socket(), cluster_.dir()};
  std::vector<json> requests_;
  std::vector<StreamOutput> want_;
};

TEST_F(UpgradeTest, CanaryIsPromotedThenRolledBackUnderLoadLosingNoRequest) {
  json promoted, rolled_back;
  const LoadResult r = LoadAround(router_.port(), requests_, want_, [&] {
    promoted = UpgradeToTheEnd(cluster_, {"--engine-version", "refengine-v2"});
    const CtlResult back =
        cluster_.Ctl({"rollback", "--steps", "50,100", "--step-ms", "300", "--min-requests", "5"});
    ASSERT_EQ(back.exit_code, 0) << back.stdout_text;
    // The reply names the command the rollback's canary runs.
    ASSERT_TRUE(back.out["engine_command"].is_array()) << back.stdout_text;
    EXPECT_NE(back.out["engine_command"][0].get<std::string>().find("baton-refengine"),
              std::string::npos)
        << back.stdout_text;
    rolled_back = WaitUpgradeEnded(cluster_, 1);
    cluster_.WaitReady("the pair after the rollback");
  });
  ExpectNoFailure(r, router_);
  EXPECT_EQ(promoted["outcome"], "promoted") << promoted.dump();
  EXPECT_EQ(promoted["version"], "refengine-v2") << promoted.dump();
  EXPECT_EQ(promoted["last_weight"], 100) << promoted.dump();
  EXPECT_EQ(rolled_back["kind"], "rollback") << rolled_back.dump();
  EXPECT_EQ(rolled_back["outcome"], "promoted") << rolled_back.dump();
  EXPECT_EQ(rolled_back["version"], "baton-refengine") << rolled_back.dump();
  const json s = cluster_.Status();
  EXPECT_EQ(EngineWithRole(s, "primary")["version"], "baton-refengine");
  EXPECT_EQ(EngineWithRole(s, "standby")["version"], "baton-refengine");
  EXPECT_EQ(s["upgrade"]["promoted"], 2);
  EXPECT_GT(MetricValue(router_.port(), EngineSeries("requests", promoted["canary"])), 0);
  cluster_.CheckFencing();
}

TEST_F(UpgradeTest, BrokenCanaryIsRolledBackAndNoClientSeesItsErrors) {
  const uint64_t primary = cluster_.Status()["pair"]["primary"].get<uint64_t>();
  json ended;
  const LoadResult r = LoadAround(router_.port(), requests_, want_, [&] {
    ended = UpgradeToTheEnd(cluster_, {"--fail-percent", "100"});
  });
  ExpectNoFailure(r, router_);
  EXPECT_EQ(ended["outcome"], "rolled_back") << ended.dump();
  EXPECT_NE(ended["reason"].get<std::string>().find("error rate"), std::string::npos)
      << ended.dump();
  const json s = cluster_.Status();
  EXPECT_EQ(s["pair"]["primary"], primary) << "the primary serves on";
  EXPECT_EQ(EngineWithRole(s, "standby")["version"], "baton-refengine");
  EXPECT_EQ(s["upgrade"]["rolled_back"], 1);
  EXPECT_GE(MetricValue(router_.port(), EngineSeries("errors", ended["canary"])), 5);
  cluster_.CheckFencing();
}

// A build whose sampling changed answers every request, fast and without errors, but not
// what the primary answers: the routers' shadow comparison catches it.
TEST_F(UpgradeTest, CanaryThatDisagreesWithThePrimaryIsRolledBack) {
  json ended;
  const LoadResult r = LoadAround(router_.port(), requests_, want_, [&] {
    ended = UpgradeToTheEnd(cluster_, {"--seed-offset", "1"});
  });
  // The canary's answers are what it sampled: the clients it served saw other outputs than
  // the reference, which is what a canary risks and why its share starts small.
  for (const std::string& f : r.failures) {
    EXPECT_NE(f.find("HTTP 200"), std::string::npos) << "every request was answered: " << f;
  }
  EXPECT_GT(r.after_fault, 0);
  EXPECT_EQ(ended["outcome"], "rolled_back") << ended.dump();
  EXPECT_NE(ended["reason"].get<std::string>().find("outputs differ"), std::string::npos)
      << ended.dump();
  EXPECT_GE(MetricValue(router_.port(), EngineSeries("disagreed", ended["canary"])), 1);
  EXPECT_TRUE(router_.Running());
  cluster_.CheckFencing();
}

// The primary dies mid-canary: the canary already serves, so it becomes the primary at once;
// the upgrade ends promoted, and the new standby runs the new command.
TEST_F(UpgradeTest, PrimaryKilledMidCanaryHandsOverToTheCanary) {
  json ended;
  uint64_t canary_id = 0;
  const LoadResult r = LoadAround(router_.port(), requests_, want_, [&] {
    const json s = StartACanaryThatStays(cluster_);  // at 50 % until the primary dies
    canary_id = EngineWithRole(s, "canary")["id"].get<uint64_t>();
    std::this_thread::sleep_for(milliseconds(300));
    EXPECT_EQ(::kill(PidOf(EngineWithRole(s, "primary")), SIGKILL), 0);
    ended = WaitUpgradeEnded(cluster_, 0);
    cluster_.WaitReady("the pair after the hand-over");
  });
  ExpectNoFailure(r, router_);
  EXPECT_EQ(ended["outcome"], "promoted") << ended.dump();
  EXPECT_NE(ended["reason"].get<std::string>().find("the primary failed"), std::string::npos)
      << ended.dump();
  const json s = cluster_.WaitFor(Settled, "the dead primary's blocks to move on");
  EXPECT_EQ(s["pair"]["primary"], canary_id);
  EXPECT_EQ(EngineWithRole(s, "standby")["version"], "refengine-v2");
  EXPECT_EQ(s["pool"]["free"], s["pool"]["promotion_reserve"]["target"])
      << "the dead primary's blocks went to the canary, but the promotion reserve's";
  cluster_.CheckFencing();
}

TEST_F(UpgradeTest, KilledCanaryIsRolledBackLosingNoRequest) {
  json ended;
  const LoadResult r = LoadAround(router_.port(), requests_, want_, [&] {
    const json s = StartACanaryThatStays(cluster_);  // at 50 % until killed
    const json canary = EngineWithRole(s, "canary");
    ASSERT_FALSE(canary.is_null()) << s.dump();
    std::this_thread::sleep_for(milliseconds(300));
    EXPECT_EQ(::kill(PidOf(canary), SIGKILL), 0);
    ended = WaitUpgradeEnded(cluster_, 0);
    cluster_.WaitReady("the pair after the rollback");
  });
  ExpectNoFailure(r, router_);
  EXPECT_EQ(ended["outcome"], "rolled_back") << ended.dump();
  EXPECT_NE(ended["reason"].get<std::string>().find("the canary failed"), std::string::npos)
      << ended.dump();
  cluster_.CheckFencing();
}

// A promoted upgrade is kept in the state directory: a restarted controller (its engines die
// with it) launches the upgraded command, and rollback still knows the previous one.
TEST(UpgradeCtlTest, APromotedUpgradeSurvivesAControllerRestart) {
  ChaosCluster cluster(RefenginePair());
  std::vector<std::string> args = UpgradeArgs({"--engine-version", "refengine-v2"});
  args[2] = "100";  // --steps: one step,
  args[6] = "1";    // --min-requests: one attempt (sent below)
  const CtlResult up = cluster.Ctl(args);
  ASSERT_EQ(up.exit_code, 0) << up.stdout_text;
  RouterProcess router(cluster.socket(), cluster.dir());
  ASSERT_TRUE(router.ready()) << router.Log();
  cluster.WaitFor(
      [&](const json& st) {
        (void)Fetch(
            router.port(), http::verb::post, "/v1/completions",
            json({{"model", kRouterTestModel}, {"prompt", "up"}, {"max_tokens", 2}}).dump());
        return !st["upgrade"]["history"].empty();
      },
      "the upgrade ended", seconds(60));
  cluster.WaitReady("the upgraded pair");
  cluster.KillController();
  cluster.RestartController();
  const json s = cluster.WaitReady("the pair after the restart");
  EXPECT_EQ(EngineWithRole(s, "primary")["version"], "refengine-v2") << s.dump();
  EXPECT_EQ(EngineWithRole(s, "standby")["version"], "refengine-v2") << s.dump();
  EXPECT_EQ(s["upgrade"]["previous_command"], json(RefenginePair().engine_command));
  cluster.CheckFencing();
}

// A controller killed mid-canary: the primary and the canary serve on, and the restarted
// controller re-adopts both and resumes the upgrade at the canary's step, with the policy the
// upgrade was started with.
TEST(UpgradeCtlTest, AnUpgradeInterruptedByAControllerRestartResumesAtItsStep) {
  ChaosCluster cluster(RefenginePair());
  const json s = StartACanaryThatStays(cluster);
  const json canary = EngineWithRole(s, "canary");
  const json primary = EngineWithRole(s, "primary");
  cluster.KillController();
  cluster.StartControllerAgain();
  const json after = cluster.WaitFor(
      [&](const json& st) {
        return !st["upgrade"]["current"].is_null() &&
               st["upgrade"]["current"]["phase"] == "canary" &&
               !st["controller"]["recovery"]["in_progress"].get<bool>();
      },
      "the upgrade resumed");
  const json& current = after["upgrade"]["current"];
  EXPECT_EQ(current["canary"], canary["id"]) << current.dump();
  EXPECT_EQ(current["weight"], 50) << current.dump();
  EXPECT_EQ(current["steps"], json::array({50, 100})) << "the policy it was started with";
  EXPECT_EQ(EngineWithRole(after, "canary")["pid"], canary["pid"]) << "the same canary process";
  EXPECT_EQ(EngineWithRole(after, "primary")["pid"], primary["pid"]);
  EXPECT_TRUE(after["upgrade"]["history"].empty()) << after["upgrade"].dump();
  EXPECT_NE(after["controller"]["recovery"]["upgrade"].get<std::string>().find("resumed at 50"),
            std::string::npos)
      << after["controller"].dump();
  // The resumed canary can be rolled back as any other.
  ASSERT_EQ(cluster.Ctl({"rollback"}).exit_code, 0);
  const json ended = WaitUpgradeEnded(cluster, 0);
  EXPECT_EQ(ended["outcome"], "rolled_back") << ended.dump();
  const json rolled = cluster.WaitReady("the pair after the rollback");
  EXPECT_EQ(rolled["upgrade"]["rolled_back"], 1);
  EXPECT_EQ(EngineWithRole(rolled, "primary")["pid"], primary["pid"]) << "the primary served on";
  EXPECT_EQ(EngineWithRole(rolled, "primary")["version"], "baton-refengine");
  EXPECT_EQ(EngineWithRole(rolled, "standby")["version"], "baton-refengine");
  cluster.CheckFencing();
}

// A controller killed mid-canary, its upgrade left to run: the resumed canary passes its last
// step and is promoted (the pair was ready again with the canary standing in for the standby).
TEST(UpgradeCtlTest, ACanaryResumedAfterAControllerRestartIsPromoted) {
  ChaosCluster cluster(RefenginePair());
  std::vector<std::string> args = UpgradeArgs({"--engine-version", "refengine-v2"});
  args[4] = "3000";  // --step-ms: long enough to kill the controller within the first step
  args[6] = "1";     // --min-requests
  ASSERT_EQ(cluster.Ctl(args).exit_code, 0);
  RouterProcess router(cluster.socket(), cluster.dir());
  ASSERT_TRUE(router.ready()) << router.Log();
  const auto send = [&] {
    (void)Fetch(router.port(), http::verb::post, "/v1/completions",
                json({{"model", kRouterTestModel}, {"prompt", "up"}, {"max_tokens", 2}}).dump());
  };
  cluster.WaitFor(
      [&](const json& st) {
        return !st["upgrade"]["current"].is_null() && st["upgrade"]["current"]["phase"] == "canary";
      },
      "the canary serves");
  cluster.KillController();
  cluster.StartControllerAgain();
  const json ended = cluster.WaitFor(
      [&](const json& st) {
        send();
        return !st["upgrade"]["history"].empty();
      },
      "the resumed upgrade ended", seconds(60));
  EXPECT_EQ(ended["upgrade"]["history"].back()["outcome"], "promoted") << ended["upgrade"].dump();
  EXPECT_NE(ended["controller"]["recovery"]["upgrade"].get<std::string>().find("resumed at 50"),
            std::string::npos)
      << ended["controller"].dump();
  const json s = cluster.WaitReady("the upgraded pair");
  EXPECT_EQ(EngineWithRole(s, "primary")["version"], "refengine-v2") << s.dump();
  EXPECT_EQ(EngineWithRole(s, "standby")["version"], "refengine-v2") << s.dump();
  cluster.CheckFencing();
}

// Killed with its canary: the restarted controller records the upgrade as rolled back, once,
// and the pair heals with the command the upgrade would have replaced.
TEST(UpgradeCtlTest, AnUpgradeWhoseCanaryDiedWithTheControllerIsRolledBackOnce) {
  ChaosCluster cluster(RefenginePair());
  const json s = StartACanaryThatStays(cluster);
  const json canary = EngineWithRole(s, "canary");
  cluster.KillController();
  ASSERT_EQ(::kill(PidOf(canary), SIGKILL), 0);
  cluster.RestartController();
  const json after = cluster.WaitReady("the pair after the restart");
  ASSERT_EQ(after["upgrade"]["history"].size(), 1u) << after["upgrade"].dump();
  const json ended = after["upgrade"]["history"][0];
  EXPECT_EQ(ended["outcome"], "rolled_back") << ended.dump();
  EXPECT_EQ(ended["canary"], canary["id"]) << ended.dump();
  EXPECT_EQ(ended["last_weight"], 50) << ended.dump();
  EXPECT_NE(ended["reason"].get<std::string>().find("the controller restarted during the upgrade "
                                                    "(phase canary)"),
            std::string::npos)
      << ended.dump();
  EXPECT_TRUE(after["upgrade"]["current"].is_null());
  EXPECT_EQ(EngineWithRole(after, "standby")["version"], "baton-refengine");
  cluster.KillController();  // recorded once: a second restart does not record it again
  cluster.RestartController();
  EXPECT_EQ(cluster.WaitReady("the pair after a second restart")["upgrade"]["history"].size(), 0u)
      << "recorded once (the history itself is not kept across restarts)";
  cluster.CheckFencing();
}

// A primary slow to answer a Reclaim is not asked again meanwhile: two answers to the same
// holdings could give away the blocks it keeps. (It answers after the canary was promoted
// with nothing, and the canary gets its share then.)
TEST(UpgradeCtlTest, ASlowPrimaryIsAskedForBlocksOnceAtATime) {
  ClusterOptions options;
  options.engine_args = {"--reclaim-delay-ms", "3000"};
  ChaosCluster cluster(options);
  const json s = CanaryOfTheSameCommand(cluster, "50,100", 8);
  EXPECT_EQ(EngineWithRole(s, "primary")["blocks"], 8) << s.dump();
  std::this_thread::sleep_for(seconds(5));  // past two more Reclaim periods (every 2 s)
  const json later = cluster.Status();
  EXPECT_EQ(EngineWithRole(later, "primary")["blocks"], 8) << later.dump();
  EXPECT_EQ(EngineWithRole(later, "canary")["blocks"], 8) << later.dump();
  const std::string log = cluster.Log();
  size_t asks = 0;
  for (size_t at = log.find("(the primary) to return"); at != std::string::npos;
       at = log.find("(the primary) to return", at + 1)) {
    ++asks;
  }
  EXPECT_EQ(asks, 1u) << log;
  // Its machine's "primary" is a serving state: the log says whose, the canary's.
  const std::string canary =
      "engine " + std::to_string(EngineWithRole(later, "canary")["id"].get<uint64_t>());
  EXPECT_NE(log.find(canary + " (canary): promoting -> primary on promote_done"), std::string::npos)
      << log;
  cluster.CheckFencing();
}

TEST(UpgradeCtlTest, RefusalsSayWhy) {
  ChaosCluster cluster(RefenginePair());
  const CtlResult none = cluster.Ctl({"upgrade"});
  EXPECT_EQ(none.exit_code, 2) << none.stdout_text;
  const CtlResult bad_steps = cluster.Ctl({"upgrade", "--steps", "50,20", "--", "x"});
  EXPECT_EQ(bad_steps.exit_code, 2) << bad_steps.stdout_text;
  const CtlResult nothing = cluster.Ctl({"rollback", "--timeout-ms", "5000"});  // batonctl's
  EXPECT_EQ(nothing.exit_code, 1) << nothing.stdout_text;
  EXPECT_NE(nothing.stdout_text.find("nothing to roll back"), std::string::npos);
  // A program that is not there: refused before the standby makes way for it.
  const json before = EngineWithRole(cluster.Status(), "standby");
  const CtlResult missing =
      cluster.Ctl({"upgrade", "--", "/nonexistent/baton-engine", "--port", "{port}"});
  EXPECT_EQ(missing.exit_code, 1) << missing.stdout_text;
  EXPECT_NE(missing.stdout_text.find("/nonexistent/baton-engine"), std::string::npos)
      << missing.stdout_text;
  EXPECT_EQ(EngineWithRole(cluster.Status(), "standby")["pid"], before["pid"])
      << "the standby stays";
  std::vector<std::string> args = UpgradeArgs({});
  args[4] = "60000";
  const CtlResult up = cluster.Ctl(args);
  ASSERT_EQ(up.exit_code, 0) << up.stdout_text;
  const CtlResult again = cluster.Ctl(args);
  EXPECT_EQ(again.exit_code, 1) << again.stdout_text;
  EXPECT_NE(again.stdout_text.find("already in progress"), std::string::npos);
  const CtlResult promote = cluster.Ctl({"promote"});
  EXPECT_EQ(promote.exit_code, 1) << promote.stdout_text;
  const CtlResult drain = cluster.Ctl({"drain"});
  EXPECT_EQ(drain.exit_code, 1) << drain.stdout_text;
  const CtlResult drill = cluster.Ctl({"drill", "kill"});
  EXPECT_EQ(drill.exit_code, 1) << drill.stdout_text;
  // The canary options shape only a rollback to the previous command: refused, not ignored.
  const CtlResult shaped = cluster.Ctl({"rollback", "--steps", "10,100", "--step-ms", "5"});
  EXPECT_EQ(shaped.exit_code, 1) << shaped.stdout_text;
  EXPECT_NE(shaped.out["error"].get<std::string>().find("without them"), std::string::npos)
      << shaped.stdout_text;
  EXPECT_FALSE(cluster.Status()["upgrade"]["current"].is_null()) << "the upgrade goes on";
  const CtlResult back = cluster.Ctl({"rollback"});
  EXPECT_EQ(back.exit_code, 0) << back.stdout_text;
  const json ended = WaitUpgradeEnded(cluster, 0);
  EXPECT_EQ(ended["outcome"], "rolled_back") << ended.dump();
  EXPECT_EQ(ended["reason"], "batonctl rollback") << ended.dump();
  cluster.WaitReady("the pair after the rollback");
  cluster.CheckFencing();
}

// The primary dies while the candidate is still starting: until an engine serves again a
// rollback is refused (stopping the candidate then could leave no engine at all). The
// candidate (engine 3, in place of the standby) waits at one gate, the engines launched after
// it at another; the candidate, let through first, is promoted by the failover, which ends
// the upgrade, and the old command's standby that follows is replaced by one of the new.
TEST(UpgradeCtlTest, NoRollbackWhileNoEngineServes) {
  const GateFile candidate("candidate"), later("later");
  ClusterOptions options = RefenginePair();
  options.register_timeout_ms = 60'000;  // an engine held at a gate is not a failure
  options.engine_wrapper = {
      "/bin/sh", "-c",
      "if [ \"$BATON_ENGINE_ID\" -gt 3 ]; then " + later.ShellWait() + "fi; exec \"$@\"",
      "held-later"};
  ChaosCluster cluster(options);
  // (Ctl runs batonctl through the shell: the candidate's script is quoted for it.)
  std::vector<std::string> args = {
      "upgrade",       "--steps", "50,100",
      "--step-ms",     "60000",   "--",
      "/bin/sh",       "-c",      "'" + candidate.ShellWait() + "exec \"$@\"'",
      "held-candidate"};
  const std::vector<std::string> command = RefenginePair().engine_command;
  args.insert(args.end(), command.begin(), command.end());
  const json before = cluster.Status();
  const CtlResult up = cluster.Ctl(args);
  ASSERT_EQ(up.exit_code, 0) << up.stdout_text;
  cluster.WaitFor(
      [](const json& st) {
        const json current =
            st.contains("upgrade") ? st["upgrade"].value("current", json()) : json();
        return current.is_object() && current.value("canary", uint64_t{0}) == 3;
      },
      "the candidate to be launched");
  ASSERT_EQ(::kill(PidOf(EngineWithRole(before, "primary")), SIGKILL), 0);
  cluster.WaitFor([](const json& st) { return PrimaryId(st) == 0; },
                  "the primary's failure to be seen");
  const CtlResult back = cluster.Ctl({"rollback"});
  EXPECT_EQ(back.exit_code, 1) << back.stdout_text;
  EXPECT_NE(back.stdout_text.find("no engine serves yet"), std::string::npos) << back.stdout_text;
  candidate.Open();
  const json ended = WaitUpgradeEnded(cluster, 0);
  EXPECT_EQ(ended["outcome"], "promoted") << ended.dump();
  EXPECT_EQ(PrimaryId(cluster.Status()), 3u);
  later.Open();
  cluster.WaitReady("the pair after the failover");
  cluster.CheckFencing();
}

// A candidate that cannot start (here: exits at once) is rolled back; the previous command's
// standby comes back.
TEST(UpgradeCtlTest, ACandidateThatCannotStartIsRolledBack) {
  ChaosCluster cluster(RefenginePair());
  const CtlResult up = cluster.Ctl({"upgrade", "--", "/bin/false"});
  ASSERT_EQ(up.exit_code, 0) << up.stdout_text;
  const json ended = WaitUpgradeEnded(cluster, 0);
  EXPECT_EQ(ended["outcome"], "rolled_back") << ended.dump();
  EXPECT_NE(ended["reason"].get<std::string>().find("the canary failed"), std::string::npos)
      << ended.dump();
  const json s = cluster.WaitReady("the pair after the rollback");
  EXPECT_EQ(EngineWithRole(s, "standby")["version"], "baton-refengine");
  EXPECT_EQ(s["upgrade"]["active_command"][0], RefenginePair().engine_command[0]);
  cluster.CheckFencing();
}

// The primary answers a Reclaim only after the upgrade ended (the canary was rolled back
// while the primary took its time): the blocks it returned go back to it, and are not left
// free until the next promotion.
TEST(UpgradeCtlTest, BlocksReturnedAfterARollbackGoBackToThePrimary) {
  ClusterOptions options;
  options.engine_args = {"--reclaim-delay-ms", "1500"};
  ChaosCluster cluster(options);
  std::vector<std::string> args = {"upgrade", "--steps", "50,100", "--step-ms", "60000", "--"};
  const json status = cluster.Status();
  for (const json& part : status["upgrade"]["active_command"]) {
    args.push_back(part.get<std::string>());
  }
  const CtlResult up = cluster.Ctl(args);
  ASSERT_EQ(up.exit_code, 0) << up.stdout_text;
  cluster.WaitFor(
      [](const json& st) {
        return !st["upgrade"]["current"].is_null() &&
               st["upgrade"]["current"]["phase"] == "reclaiming";
      },
      "the primary is asked for blocks");
  const CtlResult back = cluster.Ctl({"rollback"});
  ASSERT_EQ(back.exit_code, 0) << back.stdout_text;
  EXPECT_EQ(WaitUpgradeEnded(cluster, 0)["outcome"], "rolled_back");
  const json s = cluster.WaitFor(
      [&](const json& st) {
        const std::string log = cluster.Log();
        return log.find(" returned ") != std::string::npos &&
               log.find(" extents") != std::string::npos &&
               st["pool"]["free"] == st["pool"]["promotion_reserve"]["target"] &&
               EngineWithRole(st, "primary")["blocks"] == BlocksBesideTheReserve(st);
      },
      "the returned blocks are the primary's again, but the promotion reserve's");
  EXPECT_EQ(s["pool"]["free"], s["pool"]["promotion_reserve"]["target"]) << s.dump();
  cluster.CheckFencing();
}

}  // namespace
}  // namespace baton::chaos
