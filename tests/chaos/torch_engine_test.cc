// baton-torch-engine (python/baton-torch-engine: the PyTorch engine on Baton's Python SDK) as
// a pair's engine under the real controller and router: a stream through the router survives
// kill -9 of the primary token for token, and the pair goes through the drills (kill, hang,
// error report, batonctl promote) with the fencing checks; a long prompt's stream cut by
// kill -9 continues on the new primary from the KV the dead one left in the pool (KV-warm
// failover), without prefilling it again, and one cut by `batonctl promote` is handed over
// with its KV. Skipped, saying why, where Debian's python3-torch is missing.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "tests/chaos/kv_warm_support.h"
#include "tests/chaos/router_load.h"
#include "tests/chaos/router_stream_support.h"
#include "tests/chaos/upgrade_support.h"

namespace baton::chaos {
namespace {

using std::chrono::seconds;

// The interpreter tests/CMakeLists.txt found (the first python3 with PyTorch, else any).
constexpr const char* kPython = BATON_TEST_PYTHON;

bool TorchInstalled() {
  return *kPython != '\0' &&
         std::system((std::string(kPython) + " -c 'import torch' 2>/dev/null").c_str()) == 0;
}

// `step_ms` > 0 paces the engines (--step-interval-ms): a step at most every step_ms, so that
// a `batonctl` command lands mid-stream however fast the machine computes the tiny model.
ClusterOptions TorchPair(int step_ms = 0) {
  ClusterOptions o;
  o.engine_wrapper = {"/usr/bin/env", "BATON_LIB_DIR=" + std::string(BATON_BIN_DIR) + "/../lib",
                      std::string("BATON_PYTHON=") + kPython};
  o.engine_command =
      EngineCommand(std::string(BATON_SOURCE_DIR) + "/python/bin/baton-torch-engine");
  o.engine_command.insert(o.engine_command.end(),
                          {"--threads", "1", "--engine-version", "torch-1"});
  if (step_ms > 0) {
    o.engine_command.insert(o.engine_command.end(),
                            {"--step-interval-ms", std::to_string(step_ms)});
  }
  o.blocks = 512;
  o.register_timeout_ms = 60'000;  // importing torch takes seconds on a busy CI machine
  o.ready_timeout = seconds(90);   // two engines importing torch beside the suite's tests
  return o;
}

json WaitTorchPrimary(const ChaosCluster& cluster, uint64_t old_primary, const std::string& what) {
  return WaitNewPrimary(cluster, old_primary, what, seconds(60));
}

class TorchEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!TorchInstalled()) GTEST_SKIP() << "PyTorch is missing for " << kPython;
  }
};

// `request` streamed through the router undisturbed (`want`), then again with `cut` done to
// the primary once the first event has arrived (`got`); that primary is `killed`. The cut
// stream is checked token for token against the undisturbed one, and for a replay.
struct KilledStream {
  StreamOutput want, got;
  json killed;
};

// With `replayed` false the cut must leave the stream to its engine: nothing replayed.
void StreamAndCut(const ChaosCluster& cluster, const RouterProcess& router, const json& request,
                  const std::function<void(const json& primary)>& cut_primary, KilledStream* out,
                  bool replayed = true) {
  const std::vector<std::string> argv = {
      FindInPath("curl"), "-sS",          "-N",
      "--fail-with-body", "-H",           "Content-Type: application/json",
      "--data-binary",    request.dump(), router.url() + "/completions"};
  Child plain(argv, cluster.dir() + "/curl-reference.log", /*piped=*/true);
  while (plain.ReadMore(seconds(120))) {
  }
  ASSERT_EQ(plain.Wait(seconds(10)), 0) << ReadFile(cluster.dir() + "/curl-reference.log");
  out->want = ParseStream(plain.buffer());
  ASSERT_TRUE(out->want.error.empty()) << out->want.error << "\n" << plain.buffer();
  ASSERT_FALSE(out->want.token_ids.empty());

  out->killed = EngineWithRole(cluster.Status(), "primary");
  Child cut(argv, cluster.dir() + "/curl.log", true);
  while (cut.buffer().find("\n\n") == std::string::npos && cut.ReadMore(seconds(60))) {
  }
  ASSERT_EQ(cut.buffer().find("[DONE]"), std::string::npos) << "the stream ended before the cut";
  ASSERT_NO_FATAL_FAILURE(cut_primary(out->killed));
  while (cut.ReadMore(seconds(120))) {
  }
  EXPECT_EQ(cut.Wait(seconds(10)), 0) << ReadFile(cluster.dir() + "/curl.log") << router.Log();
  out->got = ParseStream(cut.buffer());
  EXPECT_TRUE(out->got.error.empty()) << out->got.error << "\n" << cut.buffer();
  EXPECT_EQ(out->got.token_ids, out->want.token_ids) << "a repeated or missing token";
  EXPECT_EQ(out->got.text, out->want.text);
  EXPECT_EQ(out->got.ids.size(), 1u);
  const double replays = MetricValue(router.port(), "baton_router_replays_total{kind=\"replay\"}");
  if (replayed) {
    EXPECT_GE(replays, 1) << "the cut landed after the stream: nothing was replayed";
  } else {
    EXPECT_EQ(replays, 0) << router.Log();
  }
}

void StreamAndKillThePrimary(const ChaosCluster& cluster, const RouterProcess& router,
                             const json& request, KilledStream* out) {
  StreamAndCut(
      cluster, router, request,
      [](const json& primary) { ASSERT_EQ(::kill(PidOf(primary), SIGKILL), 0); }, out);
}

// A prompt long enough that its KV spans several blocks.
std::string LongPrompt() {
  std::string prompt = "A long prompt whose KV outlives its engine:";
  while (prompt.size() < 320) prompt += " the quick brown fox jumps over the lazy dog,";
  return prompt;
}

// A seeded stream of LongPrompt().
json LongPromptRequest(int seed) {
  return {{"model", kRouterTestModel}, {"prompt", LongPrompt()}, {"seed", seed},
          {"temperature", 0.9},        {"max_tokens", 120},      {"stream", true}};
}

// The new primary adopted the cut stream's KV and its replay continued from it, the prompt
// not prefilled again (a byte tokenizer: a token per byte at least).
void ExpectContinuedFromTheKv(const ChaosCluster& cluster) {
  EXPECT_EQ(EngineMetric(cluster, "baton_engine_kv_adopted_sequences_total"), 1) << cluster.Log();
  EXPECT_EQ(EngineMetric(cluster, "baton_engine_kv_continued_requests_total"), 1);
  EXPECT_GE(EngineMetric(cluster, "baton_engine_kv_tokens_not_recomputed_total"),
            static_cast<double>(LongPrompt().size()));
}

TEST_F(TorchEngineTest, AStreamThroughTheRouterSurvivesAKillTokenForToken) {
  ChaosCluster cluster(TorchPair());
  RouterProcess router(cluster.socket(), cluster.dir());
  ASSERT_TRUE(router.ready()) << router.Log();
  const json request = {{"model", kRouterTestModel},
                        {"prompt", "Through the router:"},
                        {"seed", 4242},
                        {"temperature", 0.9},
                        {"max_tokens", 300},
                        {"stream", true}};
  KilledStream stream;
  ASSERT_NO_FATAL_FAILURE(StreamAndKillThePrimary(cluster, router, request, &stream));
  WaitTorchPrimary(cluster, stream.killed["id"], "the torch standby to take over");
  cluster.CheckFencing();
}

// KV-warm failover (docs/architecture.md): the promoted torch engine adopts the sequence whose
// records the killed one left, and the router's replay continues from its KV: the stream is
// an undisturbed run's, token for token, and the prompt is not prefilled again.
TEST_F(TorchEngineTest, AKilledPrimarysKvIsAdoptedAndTheReplayIsNotPrefilledAgain) {
  ChaosCluster cluster(TorchPair());
  RouterProcess router(cluster.socket(), cluster.dir());
  ASSERT_TRUE(router.ready()) << router.Log();
  const std::string prompt = LongPrompt();
  KilledStream stream;
  ASSERT_NO_FATAL_FAILURE(
      StreamAndKillThePrimary(cluster, router, LongPromptRequest(4343), &stream));
  WaitTorchPrimary(cluster, stream.killed["id"], "the torch standby to take over");
  ExpectContinuedFromTheKv(cluster);
  const json kv = LastTimelineKv(cluster);
  ASSERT_TRUE(kv.is_object()) << cluster.Ctl({"timeline"}).stdout_text;
  EXPECT_EQ(kv["adopted"], 1);
  EXPECT_GE(kv["tokens"].get<int>(), static_cast<int>(prompt.size()));
  // Promoted before the dead primary's barrier, it took that KV out of the quarantine: copied
  // when the copy beats the barrier, else adopted in place once granted.
  const json t = cluster.Ctl({"timeline"}).out["timeline"];
  ASSERT_TRUE(t.is_object() && t.contains("promotion")) << t.dump(2);
  if (t["promotion"].value("before_barrier", false)) {
    const std::string mode = t.contains("kv_inherited") ? t["kv_inherited"].value("mode", "") : "";
    EXPECT_TRUE(mode == "copied" || mode == "waited") << t.dump(2);
  }
  cluster.CheckFencing();
}

// A planned switch-over (`batonctl promote`) mid-stream: the torch primary hands the keyed
// stream over with its KV parked in its blocks, records committed; the promoted engine adopts
// that KV with the blocks, and the router's replay continues from it, token for token.
TEST_F(TorchEngineTest, PromoteHandsTheRunningSequenceOver) {
  ChaosCluster cluster(TorchPair(/*step_ms=*/20));
  RouterProcess router(cluster.socket(), cluster.dir());
  ASSERT_TRUE(router.ready()) << router.Log();
  KilledStream stream;
  ASSERT_NO_FATAL_FAILURE(StreamAndCut(
      cluster, router, LongPromptRequest(4444),
      [&](const json&) {
        const CtlResult promote = cluster.Ctl({"promote"});
        ASSERT_EQ(promote.exit_code, 0) << promote.stdout_text;
      },
      &stream));
  WaitTorchPrimary(cluster, stream.killed["id"], "the torch standby to take over");
  ExpectContinuedFromTheKv(cluster);
  cluster.CheckFencing();
}

// `batonctl drain` mid-stream: no next primary follows, so the torch primary hands nothing
// over and finishes the stream itself, token for token, with nothing replayed; the pair stops.
TEST_F(TorchEngineTest, ADrainedPrimaryFinishesTheStreamItself) {
  // 10 ms: the stream (120 tokens) must end well within the drain's timeout (5 s).
  ChaosCluster cluster(TorchPair(/*step_ms=*/10));
  RouterProcess router(cluster.socket(), cluster.dir());
  ASSERT_TRUE(router.ready()) << router.Log();
  KilledStream stream;
  ASSERT_NO_FATAL_FAILURE(StreamAndCut(
      cluster, router, LongPromptRequest(4545),
      [&](const json&) {
        const CtlResult drain = cluster.Ctl({"drain"});
        ASSERT_EQ(drain.exit_code, 0) << drain.stdout_text;
      },
      &stream, /*replayed=*/false));
  cluster.WaitFor(
      [](const json& s) { return s["pair"]["state"] == "stopped" && s["engines"].empty(); },
      "the drained pair stopped");
  const std::string log = cluster.Log();
  EXPECT_NE(log.find("no next primary follows this drain: finishing 1 requests"), std::string::npos)
      << log;
  EXPECT_EQ(log.find("keyed requests over to the next primary"), std::string::npos) << log;
}

TEST_F(TorchEngineTest, ThePairGoesThroughEveryDrill) {
  ChaosCluster cluster(TorchPair());
  EXPECT_EQ(EngineWithRole(cluster.Status(), "primary")["version"], "torch-1");
  for (const std::vector<std::string>& drill : {std::vector<std::string>{"drill", "kill"},
                                                {"drill", "hang"},
                                                {"drill", "error"},
                                                {"promote"}}) {
    const json primary = EngineWithRole(cluster.WaitReady(), "primary");
    const CtlResult r = cluster.Ctl(drill);
    ASSERT_EQ(r.exit_code, 0) << drill.back() << ": " << r.stdout_text;
    WaitTorchPrimary(cluster, primary["id"], "a new torch primary after " + drill.back());
    cluster.CheckFencing();
  }
}

// batonctl upgrade moves a pair of reference engines to the torch engine and rollback moves it
// back, each through the canary judge, under load through the router: every answer is the
// reference engine's (the two sample alike on this model), none is lost.
TEST_F(TorchEngineTest, AnUpgradeMovesThePairToTheTorchEngineAndARollbackMovesItBack) {
  ChaosCluster cluster(RefenginePair());
  RouterProcess router(cluster.socket(), cluster.dir());
  ASSERT_TRUE(router.ready()) << router.Log();
  std::vector<json> requests;
  std::vector<StreamOutput> want;
  References(router.port(), "Torch", 16, &requests, &want);
  json promoted, rolled_back;
  const LoadResult r = LoadAround(router.port(), requests, want, [&] {
    std::vector<std::string> args = {"upgrade", "--steps",        "50,100", "--step-ms",
                                     "300",     "--min-requests", "5",      "--"};
    const std::vector<std::string> torch = TorchPair().engine_command;
    args.insert(args.end(), torch.begin(), torch.end());
    const CtlResult up = cluster.Ctl(args);
    ASSERT_EQ(up.exit_code, 0) << up.stdout_text;
    promoted = WaitUpgradeEnded(cluster, 0);
    cluster.WaitReady("the torch pair after the upgrade");
    const CtlResult back =
        cluster.Ctl({"rollback", "--steps", "50,100", "--step-ms", "300", "--min-requests", "5"});
    ASSERT_EQ(back.exit_code, 0) << back.stdout_text;
    rolled_back = WaitUpgradeEnded(cluster, 1);
    cluster.WaitReady("the reference pair after the rollback");
  });
  ExpectNoFailure(r, router);
  EXPECT_EQ(promoted["outcome"], "promoted") << promoted.dump();
  EXPECT_EQ(promoted["version"], "torch-1") << promoted.dump();
  EXPECT_EQ(rolled_back["outcome"], "promoted") << rolled_back.dump();
  EXPECT_EQ(rolled_back["version"], "baton-refengine") << rolled_back.dump();
  cluster.CheckFencing();
}

}  // namespace
}  // namespace baton::chaos
