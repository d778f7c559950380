// `batonctl drain` can be undone: `batonctl resume` on a stopped pair launches a new one, and a
// resume with nothing drained is refused with the reason (docs/operations.md, batonctl).
#include <gtest/gtest.h>

#include "tests/chaos/chaos_harness.h"

namespace baton::chaos {
namespace {

TEST(DrainResume, ResumeStartsTheStoppedPairAgain) {
  ChaosCluster cluster;
  const json before = cluster.WaitReady();
  const CtlResult refused = cluster.Ctl({"resume"});
  EXPECT_EQ(refused.exit_code, 1) << refused.stdout_text;
  EXPECT_NE(refused.out.dump().find("nothing to resume"), std::string::npos) << refused.out.dump();

  ASSERT_EQ(cluster.Ctl({"drain"}).exit_code, 0);
  const json stopped = cluster.WaitFor(
      [](const json& s) { return s["pair"]["state"] == "stopped" && s["engines"].empty(); },
      "the drained pair stopped");
  ASSERT_EQ(stopped["pair"]["state"], "stopped");

  const CtlResult resumed = cluster.Ctl({"resume"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.stdout_text;
  const json after = cluster.WaitReady("a new pair after resume");
  EXPECT_NE(PrimaryId(after), PrimaryId(before)) << "a stopped pair resumes with new engines";
  EXPECT_GT(Epoch(after), Epoch(before));
  cluster.CheckFencing();
  const std::string log = cluster.Log();
  EXPECT_NE(log.find("resume: the stopped pair is started again"), std::string::npos) << log;
}

}  // namespace
}  // namespace baton::chaos
