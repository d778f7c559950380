// baton-router in front of a real pair of reference engines (ChaosCluster with
// baton-refengine as the engine command), subscribed to the cluster's controller socket.
//
//  * The official `openai` npm client (tests/chaos/node/stream_completion.mjs; a completion
//    and a chat completion) and curl each stream through the router, once with no failure
//    and once while the primary is killed with kill -9 after the first chunks: the client
//    must see one uninterrupted stream, with no error, equal to the no-failure output in
//    text and token ids, under one chunk id.
//  * The controller is killed (its engines live on) and restarted, and, in another test,
//    `batonctl promote` switches the pair over, while requests flow through the router: every
//    request must get 200 and the output of its reference.
//
// The tiny model generates 48 tokens in a few milliseconds, faster than a kill can land
// mid-stream, so the streams that are cut run on a paced pair (PacedRefenginePair): a step
// every 25 ms, which changes when a token comes, never which.
//
// node and npm (for `npm ci` of tests/chaos/node when node_modules is missing) and curl must
// be on PATH: scripts/install-deps installs them.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/chaos/chaos_harness.h"
#include "tests/chaos/router_load.h"
#include "tests/chaos/router_stream_support.h"

namespace baton::chaos {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr int kSignalAfterChunks = 4;
// The router's count of requests continued on another engine from the tokens already sent.
const std::string kReplays = "baton_router_replays_total{kind=\"replay\"}";

const json kStreamRequest = {{"model", kRouterTestModel},
                             {"prompt", "Through the router, past a failover:"},
                             {"seed", 4242},
                             {"temperature", 0.9},
                             {"max_tokens", 48}};

std::vector<std::string> NodeArgv(const RouterProcess& router, int signal_after, bool chat) {
  const json& r = kStreamRequest;
  return {FindInPath("node"), NodeDir() + "/stream_completion.mjs",
          "--base-url",       router.url(),
          "--model",          r["model"],
          "--prompt",         r["prompt"],
          "--seed",           std::to_string(r["seed"].get<int>()),
          "--temperature",    std::to_string(r["temperature"].get<double>()),
          "--max-tokens",     std::to_string(r["max_tokens"].get<int>()),
          "--signal-after",   std::to_string(signal_after),
          "--chat",           chat ? "1" : "0"};
}

// The node client's last line, parsed ("done" or "error"), after the stream ends.
json FinishNode(Child& node) {
  std::optional<std::string> last;
  while (std::optional<std::string> line = node.ReadLine(seconds(90))) last = line;
  const int code = node.Wait(seconds(10));
  json j = last ? json::parse(*last, nullptr, false) : json();
  if (!j.is_object()) j = {{"event", "none"}, {"stdout", last.value_or("")}};
  j["exit_code"] = code;
  return j;
}

// The official client streams through the router while the primary is killed after the
// first chunks; it must see the stream it sees without a failure. A chat stream is continued
// on the new primary's /v1/completions from its token ids and rewritten as chat chunks.
void OpenAiClientStreamSurvivesPrimaryKill(bool chat) {
  const std::string node_problem = NodeSetup();
  ASSERT_TRUE(node_problem.empty()) << node_problem;
  ChaosCluster cluster(PacedRefenginePair());
  RouterProcess router(cluster.socket(), cluster.dir());
  ASSERT_TRUE(router.ready()) << router.Log();

  Child plain(NodeArgv(router, 0, chat), cluster.dir() + "/node-reference.log", /*piped=*/true);
  ASSERT_TRUE(plain.started());
  const json want = FinishNode(plain);
  ASSERT_EQ(want["event"], "done")
      << want.dump() << ReadFile(cluster.dir() + "/node-reference.log");
  ASSERT_FALSE(want["token_ids"].empty()) << want.dump();

  Child node(NodeArgv(router, kSignalAfterChunks, chat), cluster.dir() + "/node.log", true);
  ASSERT_TRUE(node.started());
  const std::optional<std::string> line = node.ReadLine(seconds(60));
  ASSERT_TRUE(line.has_value()) << "no chunks from the node client\n"
                                << ReadFile(cluster.dir() + "/node.log");
  ASSERT_EQ(json::parse(*line, nullptr, false).value("event", ""), "chunks") << *line;
  const CtlResult kill = cluster.Ctl({"drill", "kill"});
  node.WriteLine("killed");
  EXPECT_EQ(kill.exit_code, 0) << kill.stdout_text;

  const json got = FinishNode(node);
  EXPECT_EQ(got["event"], "done") << got.dump() << "\n" << router.Log();
  EXPECT_EQ(got["exit_code"], 0);
  const int chunks_at_kill = got.value("chunks", 0) - got.value("chunks_after_signal", 0);
  EXPECT_LT(chunks_at_kill, want.value("chunks", 0)) << "the stream had ended before the kill";
  EXPECT_EQ(got["text"], want["text"]);
  EXPECT_EQ(got["token_ids"], want["token_ids"]);
  EXPECT_EQ(got["ids"].size(), 1u) << "chunk ids changed mid-stream: " << got["ids"];
  EXPECT_EQ(got["created"].size(), 1u) << got["created"];
  EXPECT_EQ(got["objects"], json::array({chat ? "chat.completion.chunk" : "text_completion"}));
  EXPECT_GE(MetricValue(router.port(), kReplays), 1) << "the router replayed nothing";
  cluster.WaitReady("the pair after the kill");
  EXPECT_TRUE(router.Running());
}

TEST(RouterStreamTest, OpenAiClientStreamSurvivesPrimaryKill) {
  OpenAiClientStreamSurvivesPrimaryKill(/*chat=*/false);
}

TEST(RouterStreamTest, OpenAiClientChatStreamSurvivesPrimaryKill) {
  OpenAiClientStreamSurvivesPrimaryKill(/*chat=*/true);
}

TEST(RouterStreamTest, CurlStreamSurvivesPrimaryKill) {
  const std::string curl = FindInPath("curl");
  ASSERT_FALSE(curl.empty()) << "curl not found on PATH: run scripts/install-deps";
  ChaosCluster cluster(PacedRefenginePair());
  RouterProcess router(cluster.socket(), cluster.dir());
  ASSERT_TRUE(router.ready()) << router.Log();
  json request = kStreamRequest;
  request["stream"] = true;
  const std::vector<std::string> argv = {curl,
                                         "-sS",
                                         "-N",
                                         "--fail-with-body",
                                         "-H",
                                         "Content-Type: application/json",
                                         "--data-binary",
                                         request.dump(),
                                         router.url() + "/completions"};

  Child plain(argv, cluster.dir() + "/curl-reference.log", /*piped=*/true);
  while (plain.ReadMore(seconds(60))) {
  }
  ASSERT_EQ(plain.Wait(seconds(10)), 0) << ReadFile(cluster.dir() + "/curl-reference.log");
  const StreamOutput want = ParseStream(plain.buffer());
  ASSERT_TRUE(want.error.empty()) << want.error << "\n" << plain.buffer();
  ASSERT_FALSE(want.token_ids.empty());

  Child cut(argv, cluster.dir() + "/curl.log", true);
  auto events = [&] {
    size_t n = 0;
    for (size_t pos = 0; (pos = cut.buffer().find("\n\n", pos)) != std::string::npos; pos += 2) {
      ++n;
    }
    return n;
  };
  while (events() < kSignalAfterChunks && cut.ReadMore(seconds(60))) {
  }
  ASSERT_GE(events(), static_cast<size_t>(kSignalAfterChunks)) << cut.buffer();
  ASSERT_EQ(cut.buffer().find("[DONE]"), std::string::npos) << "the stream ended before the kill";
  const CtlResult kill = cluster.Ctl({"drill", "kill"});
  EXPECT_EQ(kill.exit_code, 0) << kill.stdout_text;
  while (cut.ReadMore(seconds(90))) {
  }
  EXPECT_EQ(cut.Wait(seconds(10)), 0)
      << "curl failed: " << ReadFile(cluster.dir() + "/curl.log") << "\n"
      << router.Log();
  const StreamOutput got = ParseStream(cut.buffer());
  EXPECT_TRUE(got.error.empty()) << got.error << "\n" << cut.buffer();
  EXPECT_EQ(got.text, want.text);
  EXPECT_EQ(got.token_ids, want.token_ids);
  EXPECT_EQ(got.ids.size(), 1u);
  EXPECT_EQ(got.created.size(), 1u);
  EXPECT_GE(MetricValue(router.port(), kReplays), 1) << "the router replayed nothing";
  cluster.WaitReady("the pair after the kill");
}

TEST(RouterStreamTest, ControllerRestartUnderLoadLosesNoRequest) {
  ChaosCluster cluster(TolerantHealth(RefenginePair()));  // no failover may come of the load
  RouterProcess router(cluster.socket(), cluster.dir());
  ASSERT_TRUE(router.ready()) << router.Log();
  std::vector<json> requests;
  std::vector<StreamOutput> want;
  References(router.port(), "Controller restart", 48, &requests, &want);
  const LoadResult r = LoadAround(router.port(), requests, want, [&] {
    cluster.KillController();
    std::this_thread::sleep_for(milliseconds(300));
    cluster.RestartController();
  });
  ExpectNoFailure(r, router);
  // The engines outlived the controller; the restarted one re-adopted them, and the router
  // sees the same primary at the same epoch: no failover, no ramp, nothing replayed.
  const std::string log = ReadFile(cluster.dir() + "/router.log");
  EXPECT_NE(log.find("a new controller (pid"), std::string::npos) << router.Log();
  EXPECT_NE(log.find("re-adopted primary"), std::string::npos) << router.Log();
  EXPECT_EQ(MetricValue(router.port(), "baton_router_failovers_total"), 0);
  // One log line per change: a table sent again on the new connection is not logged again.
  std::istringstream lines(log);
  std::string line, last_table;
  while (std::getline(lines, line)) {
    const size_t at = line.find("route table v");
    if (at == std::string::npos) continue;
    EXPECT_NE(line.substr(at), last_table) << "logged twice in a row:\n" << log;
    last_table = line.substr(at);
  }
}

// batonctl promote under load: the primary drains (finishes what it has), the standby takes
// over, and the router moves new requests to it; nothing is lost or changed.
TEST(RouterStreamTest, GracefulPromoteUnderLoadLosesNoRequest) {
  ChaosCluster cluster(RefenginePair());
  RouterProcess router(cluster.socket(), cluster.dir());
  ASSERT_TRUE(router.ready()) << router.Log();
  std::vector<json> requests;
  std::vector<StreamOutput> want;
  References(router.port(), "Graceful promote", 48, &requests, &want);
  const uint64_t before = cluster.Status()["pair"]["primary"].get<uint64_t>();
  const LoadResult r = LoadAround(router.port(), requests, want, [&] {
    const CtlResult promote = cluster.Ctl({"promote"});
    EXPECT_EQ(promote.exit_code, 0) << promote.stdout_text;
    cluster.WaitReady("pair ready after the promotion");
  });
  ExpectNoFailure(r, router);
  EXPECT_NE(cluster.Status()["pair"]["primary"].get<uint64_t>(), before);
  cluster.CheckFencing();
}

// batonctl promote under load, and the standby is killed right after: nothing is lost or
// changed either way the race goes. Usually the primary is still draining, the switch-over
// is called off and the same primary serves on, taking the requests that queued in the
// router meanwhile; the tiny model's requests are so short that its drain may also end
// first, and then a fresh engine cold-starts while the router queues. (The called-off path
// without a race: ChaosFailover.SwitchoverWhoseStandbyDiesIsCalledOff.)
TEST(RouterStreamTest, PromoteWhoseStandbyDiesUnderLoadLosesNoRequest) {
  ChaosCluster cluster(TolerantHealth(RefenginePair()));
  RouterProcess router(cluster.socket(), cluster.dir());
  ASSERT_TRUE(router.ready()) << router.Log();
  std::vector<json> requests;
  std::vector<StreamOutput> want;
  References(router.port(), "Called-off promote", 48, &requests, &want);
  const json before = cluster.Status();
  const json primary = EngineWithRole(before, "primary");
  const json standby = EngineWithRole(before, "standby");
  const LoadResult r = LoadAround(router.port(), requests, want, [&] {
    const CtlResult promote = cluster.Ctl({"promote"});
    EXPECT_EQ(promote.exit_code, 0) << promote.stdout_text;
    EXPECT_EQ(::kill(PidOf(standby), SIGKILL), 0);
    cluster.WaitReady("pair ready with a new standby");
  });
  ExpectNoFailure(r, router);
  const json after = cluster.Status();
  const bool called_off = after["controller"]["switchovers_called_off"] == 1;
  ::testing::Test::RecordProperty("called_off", called_off ? "yes" : "no (the drain won)");
  if (called_off) {
    EXPECT_EQ(EngineWithRole(after, "primary")["pid"], primary["pid"]);
  } else {
    EXPECT_NE(EngineWithRole(after, "primary")["id"], primary["id"]);
    EXPECT_NE(EngineWithRole(after, "primary")["id"], standby["id"]);
  }
  cluster.CheckFencing();
}

}  // namespace
}  // namespace baton::chaos
