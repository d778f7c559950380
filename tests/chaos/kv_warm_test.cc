// KV-warm failover end to end: baton-router in front of a pair of reference engines, a
// stream cut by the primary's death, and the new primary continuing it from the KV the dead
// one left in the pool (docs/architecture.md, "KV-warm failover"):
//
//  * kill -9 mid-stream, or a hang (SIGSTOP: killed and reaped before anything is read): the
//    new primary adopts the sequence and continues it; the client's stream equals an
//    undisturbed one, token for token;
//  * the primary killed inside a record's commit (failpoint kv_mid_commit): the record is
//    torn, the sequence is dropped, and the replay prefills; the stream is still the same;
//  * the primary killed after a step's KV writes and before their commit (failpoint
//    kv_before_commit): the successor adopts the step before and continues;
//  * a standby of another KV format (another engine version) adopts nothing;
//  * `batonctl promote` mid-stream hands the running sequence over without a prefill;
//  * the primary's compute stalls (its heartbeats going on): the router reports it, the
//    controller kills it as hung, and the stream goes on from its KV; the same behind a
//    router of a fleet, whose report in etcd carries the stall to the node's controller;
//  * the same under a request that is not streamed: the engine's own progress reports show
//    its steps standing still, the controller kills it as hung, and the router replays the
//    request on the new primary.
//
// A failpoint is armed in the engine launched as the primary only, by a shell wrapper.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "tests/chaos/chaos_harness.h"
#include "tests/chaos/kv_warm_support.h"
#include "tests/chaos/router_stream_support.h"
#include "tests/fleet/etcd_cluster.h"

namespace baton::chaos {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr int kCutAfterChunks = 4;

json StreamRequest() {
  return {{"model", kRouterTestModel},
          {"prompt", "A stream whose KV outlives its engine:"},
          {"seed", 777},
          {"temperature", 0.9},
          {"max_tokens", 64},
          {"stream", true}};
}

std::vector<std::string> CurlArgv(const RouterProcess& router) {
  return {FindInPath("curl"),
          "-sS",
          "-N",
          "--fail-with-body",
          "-H",
          "Content-Type: application/json",
          "--data-binary",
          StreamRequest().dump(),
          router.url() + "/completions"};
}

size_t Events(const std::string& body) {
  size_t n = 0;
  for (size_t pos = 0; (pos = body.find("\n\n", pos)) != std::string::npos; pos += 2) ++n;
  return n;
}

// Streams the request through the router; `cut` runs once kCutAfterChunks events arrived
// (none when null). Returns the stream as the client saw it.
StreamOutput Stream(const ChaosCluster& cluster, const RouterProcess& router,
                    const std::string& tag, const std::function<void()>& cut) {
  Child curl(CurlArgv(router), cluster.dir() + "/curl-" + tag + ".log", /*piped=*/true);
  EXPECT_TRUE(curl.started());
  if (cut) {
    while (Events(curl.buffer()) < kCutAfterChunks && curl.ReadMore(seconds(60))) {
    }
    EXPECT_EQ(curl.buffer().find("[DONE]"), std::string::npos)
        << tag << ": the stream ended before the cut";
    cut();
  }
  while (curl.ReadMore(seconds(90))) {
  }
  EXPECT_EQ(curl.Wait(seconds(10)), 0) << tag << ": " << curl.buffer();
  StreamOutput out = ParseStream(curl.buffer());
  EXPECT_TRUE(out.error.empty()) << tag << ": " << out.error << "\n" << curl.buffer();
  return out;
}

// The engine launched as the primary (BATON_ROLE, set by the controller) gets `failpoint`.
ClusterOptions PairWithPrimaryFailpoint(const std::string& failpoint) {
  ClusterOptions o = RefenginePair();
  o.engine_wrapper = {"/bin/sh", "-c",
                      "if [ \"$BATON_ROLE\" = primary ]; then export BATON_FAILPOINTS=" +
                          failpoint + "; fi; exec \"$@\"",
                      "engine-wrapper"};
  return o;
}

// The first ready standby is promoted, which may be the engine launched as the standby; a
// switch-over then makes the one launched as the primary serve (the wrappers key on that).
void ServeFromTheEngineLaunchedAsPrimary(const ChaosCluster& cluster) {
  if (EngineWithRole(cluster.Status(), "primary").value("launched_as", "") == "primary") return;
  const CtlResult promote = cluster.Ctl({"promote"});
  ASSERT_EQ(promote.exit_code, 0) << promote.stdout_text;
  const json ready = cluster.WaitReady("the pair after the switch-over");
  ASSERT_EQ(EngineWithRole(ready, "primary").value("launched_as", ""), "primary") << ready.dump();
}

// The primary dies by itself at a failpoint mid-stream; the stream must equal an
// undisturbed one streamed afterwards on the new pair.
void StreamSurvivesFailpoint(const std::string& tag, const std::string& failpoint, double adopted,
                             double dropped_torn) {
  ChaosCluster cluster(PairWithPrimaryFailpoint(failpoint));
  RouterProcess router(cluster.socket(), cluster.dir());
  ASSERT_TRUE(router.ready()) << router.Log();
  ASSERT_NO_FATAL_FAILURE(ServeFromTheEngineLaunchedAsPrimary(cluster));
  const uint64_t first = PrimaryId(cluster.Status());
  const StreamOutput got = Stream(cluster, router, tag, nullptr);
  const json after = cluster.WaitReady("the pair after the failpoint");
  ASSERT_NE(PrimaryId(after), first) << "the failpoint did not fire mid-stream\n" << cluster.Log();
  EXPECT_EQ(EngineMetric(cluster, "baton_engine_kv_adopted_sequences_total"), adopted)
      << cluster.Log();
  EXPECT_EQ(EngineMetric(cluster, "baton_engine_kv_dropped_sequences_total{reason=\"torn\"}"),
            dropped_torn);
  EXPECT_EQ(EngineMetric(cluster, "baton_engine_kv_continued_requests_total"), adopted);
  const StreamOutput want = Stream(cluster, router, tag + "-reference", nullptr);
  EXPECT_EQ(got.token_ids, want.token_ids);
  EXPECT_EQ(got.text, want.text);
  cluster.CheckFencing();
}

// `batonctl drill DRILL` mid-stream; the new primary must continue from the KV the old one
// left (a hung one is killed and reaped before anything is read).
void DrillMidStreamContinuesFromTheKv(const std::string& drill) {
  ChaosCluster cluster(PacedRefenginePair());
  RouterProcess router(cluster.socket(), cluster.dir());
  ASSERT_TRUE(router.ready()) << router.Log();
  const StreamOutput want = Stream(cluster, router, "reference", nullptr);
  const StreamOutput got = Stream(cluster, router, drill, [&] {
    const CtlResult done = cluster.Ctl({"drill", drill});
    EXPECT_EQ(done.exit_code, 0) << done.stdout_text;
  });
  EXPECT_EQ(got.token_ids, want.token_ids);
  EXPECT_EQ(got.text, want.text);
  cluster.WaitReady("the pair after the drill");
  EXPECT_EQ(EngineMetric(cluster, "baton_engine_kv_adopted_sequences_total"), 1);
  EXPECT_EQ(EngineMetric(cluster, "baton_engine_kv_continued_requests_total"), 1);
  EXPECT_GT(EngineMetric(cluster, "baton_engine_kv_tokens_not_recomputed_total"), 0);
  const json kv = LastTimelineKv(cluster);
  ASSERT_TRUE(kv.is_object()) << cluster.Ctl({"timeline"}).stdout_text;
  EXPECT_EQ(kv["adopted"], 1);
  EXPECT_GT(kv["tokens"].get<int>(), 0);
  EXPECT_GE(MetricValue(router.port(), "baton_router_failover_next_token_seconds_count"), 1);
  cluster.CheckFencing();
}

TEST(KvWarmFailover, KillMidStreamContinuesFromTheDeadPrimarysKv) {
  DrillMidStreamContinuesFromTheKv("kill");
}

TEST(KvWarmFailover, HangMidStreamContinuesFromTheHungPrimarysKv) {
  DrillMidStreamContinuesFromTheKv("hang");
}

TEST(KvWarmFailover, TornRecordIsDroppedAndTheReplayPrefills) {
  StreamSurvivesFailpoint("torn", "kv_mid_commit:12", /*adopted=*/0, /*dropped_torn=*/1);
}

TEST(KvWarmFailover, DeathBetweenKvWriteAndCommitAdoptsTheStepBefore) {
  StreamSurvivesFailpoint("uncommitted", "kv_before_commit:12", /*adopted=*/1,
                          /*dropped_torn=*/0);
}

// A stream `name` through `router` on the primary, whose compute stalls mid-stream: a new
// primary serves once the stall is acted on, and the stream came out whole, as a reference
// stream on the new primary gives it.
void StalledStreamIsReplacedWhole(const ChaosCluster& cluster, const RouterProcess& router,
                                  const std::string& name) {
  const uint64_t first = PrimaryId(cluster.Status());
  const StreamOutput got = Stream(cluster, router, name, nullptr);
  const json after = cluster.WaitReady("the pair after the stall");
  ASSERT_NE(PrimaryId(after), first) << "the stall was not acted on\n" << cluster.Log();
  const StreamOutput want = Stream(cluster, router, name + "-reference", nullptr);
  EXPECT_EQ(got.token_ids, want.token_ids);
  EXPECT_EQ(got.text, want.text);
}

// The primary's compute stalls mid-stream (failpoint generator_step:N:stall: its step
// thread stops for good) while its SDK's heartbeats go on, so the controller alone would
// never notice. The router finds the stream standing still past its stall timeout and says
// so; the controller kills the primary as hung, and the new primary continues the stream from
// the KV it left.
TEST(KvWarmFailover, ComputeStalledMidStreamIsFoundByTheRouterAndReplaced) {
  ChaosCluster cluster(PairWithPrimaryFailpoint("generator_step:20:stall"));
  RouterProcess router({"--controller", cluster.socket(), "--stall-timeout-ms", "1000"},
                       cluster.dir(), "router.log");
  ASSERT_TRUE(router.ready()) << router.Log();
  ASSERT_NO_FATAL_FAILURE(ServeFromTheEngineLaunchedAsPrimary(cluster));
  ASSERT_NO_FATAL_FAILURE(StalledStreamIsReplacedWhole(cluster, router, "stalled"));
  EXPECT_NE(cluster.Log().find("fenced: hung: no byte on its 1 answering streams for"),
            std::string::npos)
      << cluster.Log();
  EXPECT_GE(MetricValue(router.port(), "baton_router_engine_stalls_total"), 1);
  EXPECT_NE(router.Log().find("reported stalled to the controller"), std::string::npos);
  cluster.CheckFencing();
}

// Waits until `router` lists `node` with a primary in its /health `fleet` object.
bool FleetListed(const RouterProcess& router, const std::string& node) {
  for (int k = 0; k < 600; ++k) {
    const json health = json::parse(
        Fetch(router.port(), http::verb::get, "/health", "", seconds(5)).body, nullptr, false);
    if (health.is_object() && health["fleet"].is_object()) {
      for (const json& n : health["fleet"]["nodes"]) {
        if (n["node"] == node && n["listed"] == true && n["primary"] != "") return true;
      }
    }
    std::this_thread::sleep_for(milliseconds(50));
  }
  return false;
}

// The same stall behind a router of a fleet (--etcd): it subscribes to no controller, so the
// stall travels in its report for the node in etcd, which the node's controller reads and
// judges as a socket router's EngineStalled. The engine's own progress check is off: only the
// router's report can find the hang.
TEST(KvWarmFailover, ComputeStalledMidStreamBehindAFleetRouterIsReplaced) {
  ASSERT_TRUE(fleet_test::EtcdCluster::Installed()) << "etcd-server is not installed";
  fleet_test::EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.WaitHealthy()) << "etcd did not come up:\n" << etcd.LogTails();
  ClusterOptions o = PairWithPrimaryFailpoint("generator_step:20:stall");
  o.compute_stall_timeout_ms = 0;
  o.extra_toml = "[fleet]\netcd = \"" + etcd.endpoints()[0] +
                 "\"\nprefix = \"/kv/\"\nnode = \"node-a\"\nmodel = \"" + kRouterTestModel + "\"\n";
  ChaosCluster cluster(o);
  RouterProcess router({"--etcd", etcd.endpoints()[0], "--etcd-prefix", "/kv/",
                        "--fleet-router-name", "fleet-r", "--stall-timeout-ms", "1000"},
                       cluster.dir(), "router.log");
  ASSERT_TRUE(router.ready()) << router.Log();
  ASSERT_NO_FATAL_FAILURE(ServeFromTheEngineLaunchedAsPrimary(cluster));
  ASSERT_TRUE(FleetListed(router, "node-a")) << router.Log();
  ASSERT_NO_FATAL_FAILURE(StalledStreamIsReplacedWhole(cluster, router, "fleet-stalled"));
  EXPECT_NE(cluster.Log().find("answering streams for"), std::string::npos) << cluster.Log();
  EXPECT_NE(cluster.Log().find("(router fleet fleet-r)"), std::string::npos) << cluster.Log();
  EXPECT_GE(MetricValue(router.port(), "baton_router_engine_stalls_total"), 1);
  EXPECT_NE(router.Log().find("of node node-a sent nothing"), std::string::npos) << router.Log();
  cluster.CheckFencing();
}

// The primary's compute stalls under a request that is not streamed: no stream stands still
// for a router to see, but the engine's own progress (Progress, with its heartbeats) shows
// requests pending and no step finishing. The controller kills it as hung after its
// compute_stall_timeout_ms, and the router replays the request on the new primary: the client
// gets the whole completion, the same as an undisturbed one, instead of a timeout.
TEST(KvWarmFailover, ComputeStalledNonStreamedIsFoundByTheEngineAndReplayed) {
  ClusterOptions o = PairWithPrimaryFailpoint("generator_step:20:stall");
  o.compute_stall_timeout_ms = 1000;
  ChaosCluster cluster(o);
  RouterProcess router(cluster.socket(), cluster.dir());
  ASSERT_TRUE(router.ready()) << router.Log();
  ASSERT_NO_FATAL_FAILURE(ServeFromTheEngineLaunchedAsPrimary(cluster));
  const uint64_t first = PrimaryId(cluster.Status());
  json request = StreamRequest();
  request["stream"] = false;
  const Reply got =
      Fetch(router.port(), http::verb::post, "/v1/completions", request.dump(), seconds(90));
  ASSERT_EQ(got.status, 200) << got.error << got.body << "\n" << cluster.Log();
  const json after = cluster.WaitReady("the pair after the stall");
  ASSERT_NE(PrimaryId(after), first) << "the stall was not acted on\n" << cluster.Log();
  const Reply want =
      Fetch(router.port(), http::verb::post, "/v1/completions", request.dump(), seconds(90));
  const StreamOutput g = ParseWhole(got.body);
  const StreamOutput w = ParseWhole(want.body);
  EXPECT_TRUE(g.error.empty()) << g.error;
  EXPECT_EQ(g.token_ids, w.token_ids);
  EXPECT_EQ(g.text, w.text);
  EXPECT_NE(cluster.Log().find("fenced: hung: compute stalled: no step finished for"),
            std::string::npos)
      << cluster.Log();
  EXPECT_EQ(MetricValue(router.port(), "baton_router_engine_stalls_total"), 0);
  cluster.CheckFencing();
}

TEST(KvWarmFailover, StandbyOfAnotherKvFormatAdoptsNothing) {
  ClusterOptions o = PacedRefenginePair();
  // Every engine launched as a standby says it writes another KV format (an engine upgrade
  // that changed its layout): the promoted one must not adopt the first primary's records.
  o.engine_wrapper = {"/bin/sh", "-c",
                      "if [ \"$BATON_ROLE\" = primary ]; then exec \"$@\"; fi; "
                      "exec \"$@\" --kv-format other-kv/2",
                      "engine-wrapper"};
  ChaosCluster cluster(o);
  RouterProcess router(cluster.socket(), cluster.dir());
  ASSERT_TRUE(router.ready()) << router.Log();
  ASSERT_NO_FATAL_FAILURE(ServeFromTheEngineLaunchedAsPrimary(cluster));
  const StreamOutput want = Stream(cluster, router, "reference", nullptr);
  const StreamOutput got = Stream(cluster, router, "kill", [&] {
    EXPECT_EQ(cluster.Ctl({"drill", "kill"}).exit_code, 0);
  });
  EXPECT_EQ(got.token_ids, want.token_ids);
  cluster.WaitReady("the pair after the kill");
  EXPECT_EQ(EngineMetric(cluster, "baton_engine_kv_adopted_sequences_total"), 0);
  EXPECT_EQ(EngineMetric(cluster, "baton_engine_kv_dropped_sequences_total{reason=\"identity\"}"),
            1);
}

TEST(KvWarmFailover, PromoteHandsTheRunningSequenceOver) {
  ChaosCluster cluster(PacedRefenginePair());
  RouterProcess router(cluster.socket(), cluster.dir());
  ASSERT_TRUE(router.ready()) << router.Log();
  const StreamOutput want = Stream(cluster, router, "reference", nullptr);
  const uint64_t before = PrimaryId(cluster.Status());
  const StreamOutput got = Stream(cluster, router, "promote", [&] {
    const CtlResult promote = cluster.Ctl({"promote"});
    EXPECT_EQ(promote.exit_code, 0) << promote.stdout_text;
  });
  EXPECT_EQ(got.token_ids, want.token_ids);
  EXPECT_EQ(got.text, want.text);
  const json after = cluster.WaitReady("the pair after the switch-over");
  EXPECT_NE(PrimaryId(after), before);
  EXPECT_EQ(EngineMetric(cluster, "baton_engine_kv_adopted_sequences_total"), 1);
  EXPECT_EQ(EngineMetric(cluster, "baton_engine_kv_continued_requests_total"), 1);
  cluster.CheckFencing();
}

}  // namespace
}  // namespace baton::chaos
