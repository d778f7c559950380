// `batonctl drain` can be undone: `batonctl resume` on a stopped pair launches a new one, and a
// resume with nothing drained is refused with the reason (docs/operations.md, batonctl). A
// drain lets the primary finish the requests in flight (no next primary follows to hand them
// to), its router answers 503 `out_of_service` at once, and a drained pair stays out of
// service through a controller restart.
#include <gtest/gtest.h>

#include <thread>

#include "tests/chaos/chaos_harness.h"
#include "tests/chaos/router_stream_support.h"

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

// The router of a drained pair says so on /health and answers a request 503 `out_of_service`
// at once (docs/router.md), not 429 past its queue's wait.
void ExpectOutOfService(uint16_t port) {
  Reply health;
  for (int i = 0; i < 100; ++i) {  // the stopped table reaches the router after status says so
    health = Fetch(port, http::verb::get, "/health", "", std::chrono::seconds(5));
    if (health.body.find("\"out_of_service\"") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(health.status, 503) << health.body;
  EXPECT_NE(health.body.find(R"("status":"out_of_service")"), std::string::npos) << health.body;
  const json request = {{"model", kRouterTestModel}, {"prompt", "x"}, {"max_tokens", 4}};
  // Shorter than the queue's wait (5 s): an answer within it is not the queue's 429.
  const Reply r =
      Fetch(port, http::verb::post, "/v1/completions", request.dump(), std::chrono::seconds(4));
  EXPECT_EQ(r.status, 503) << r.body << r.error;
  EXPECT_NE(r.body.find(R"("code":"out_of_service")"), std::string::npos) << r.body;
}

// The router streams a request a step every 20 ms (its first event arrived) when the pair is
// drained: the primary (a reference engine, KV handoff on) finishes it, equal to its
// undisturbed run, rather than handing it over to a next primary that never comes. The
// stopped pair's router answers 503 at once. The controller then dies with kill -9: the next
// one launches no engine, the pair stays stopped until `batonctl resume`.
TEST(DrainResume, TheDrainedPrimaryFinishesItsRequestsAndThePairStaysDrainedThroughARestart) {
  ChaosCluster cluster(PacedRefenginePair(20));
  RouterProcess router({"--controller", cluster.socket()}, cluster.dir(), "router.log");
  ASSERT_TRUE(router.ready()) << router.Log();
  cluster.WaitReady();
  const json request = {{"model", kRouterTestModel},
                        {"prompt", "drained while streaming"},
                        {"seed", 17},
                        {"temperature", 0.7},
                        {"max_tokens", 60},
                        {"stream", true}};
  const Reply reference = Fetch(router.port(), http::verb::post, "/v1/completions", request.dump());
  ASSERT_EQ(reference.status, 200) << reference.body << reference.error;
  const StreamOutput want = ParseStream(reference.body);
  ASSERT_TRUE(want.error.empty()) << want.error;

  // The drain comes once the primary streams the request: its first event has arrived.
  Child curl(
      {FindInPath("curl"), "-sS", "-N", "--fail-with-body", "-H", "Content-Type: application/json",
       "--data-binary", request.dump(), router.url() + "/completions"},
      cluster.dir() + "/curl.log", /*piped=*/true);
  ASSERT_TRUE(curl.started());
  while (curl.buffer().find("\n\n") == std::string::npos &&
         curl.ReadMore(std::chrono::seconds(60))) {
  }
  ASSERT_NE(curl.buffer().find("\n\n"), std::string::npos) << "no event streamed";
  const CtlResult drained = cluster.Ctl({"drain"});
  while (curl.ReadMore(std::chrono::seconds(90))) {
  }
  EXPECT_EQ(drained.exit_code, 0) << drained.stdout_text;
  ASSERT_EQ(curl.Wait(std::chrono::seconds(10)), 0) << "not 200\n" << curl.buffer();
  const StreamOutput got = ParseStream(curl.buffer());
  EXPECT_TRUE(got.error.empty()) << got.error << "\n" << curl.buffer();
  EXPECT_EQ(got.token_ids, want.token_ids);
  EXPECT_TRUE(got.done);
  cluster.WaitFor(
      [](const json& s) { return s["pair"]["state"] == "stopped" && s["engines"].empty(); },
      "the drained pair stopped");
  ExpectOutOfService(router.port());

  cluster.KillController();
  cluster.StartControllerAgain();
  cluster.WaitFor(
      [](const json& s) {
        return s.contains("controller") && s["controller"]["recovery"]["in_progress"] == false;
      },
      "the restarted controller's start");
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const json held = cluster.Status();
  EXPECT_EQ(held["pair"]["state"], "stopped") << held.dump();
  EXPECT_TRUE(held["engines"].empty()) << held.dump();
  EXPECT_NE(cluster.Log().find("the pair stays out of service"), std::string::npos)
      << cluster.Log();
  ASSERT_EQ(cluster.Ctl({"resume"}).exit_code, 0);
  cluster.WaitReady("the resumed pair");
  cluster.CheckFencing();
}

}  // namespace
}  // namespace baton::chaos
