// Shadow comparison (ShadowComparer): the helpers alone, then a router subscribed to a fake
// controller whose table has a primary at weight 0 and a canary at 100 %, both scripted
// backends. Every client request goes to the canary; a reproducible one is sent again to the
// primary once the client has its answer, and the token ids are compared on the canary's
// engine id. The client always gets the canary's answer unchanged. Last, two real
// baton-refengines of one model as canary and primary: their seeded answers agree.
#include "router/canary/shadow_comparer.h"

#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "proto/hello.h"
#include "proto/transport/listener.h"
#include "router/router.h"
#include "router/upstream/request_key.h"
#include "tests/proto/http/http_test_client.h"
#include "tests/proto/proto_test_util.h"
#include "tests/router/loopback_listener.h"
#include "tests/router/scripted_backend.h"
#include "tests/router/wait_for.h"
#include "tests/standby/tiny_engine.h"

namespace baton {
namespace {

using Json = nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr uint64_t kPrimaryId = 1;
constexpr uint64_t kCanaryId = 2;

TEST(ShadowHelpersTest, AnswerTokenIds) {
  EXPECT_EQ(AnswerTokenIds(R"({"choices":[{"text":"a","token_ids":[3,4]}]})"),
            (std::vector<int32_t>{3, 4}));
  EXPECT_EQ(AnswerTokenIds(R"({"choices":[{"token_ids":[]}]})"), std::vector<int32_t>{});
  EXPECT_FALSE(AnswerTokenIds(R"({"choices":[{"text":"a"}]})"));
  EXPECT_FALSE(AnswerTokenIds(R"({"choices":[{"token_ids":[1]},{"token_ids":[1]}]})"));
  EXPECT_FALSE(AnswerTokenIds(R"({"choices":[{"token_ids":[1,"x"]}]})"));
  EXPECT_FALSE(AnswerTokenIds("not json"));
}

TEST(ShadowHelpersTest, ShadowBodyAsksForOneWholeAnswerWithIds) {
  std::optional<std::string> body = ShadowBody(
      R"({"prompt":"x","seed":7,"stream":true,"stream_options":{"include_usage":true}})");
  ASSERT_TRUE(body);
  const Json j = Json::parse(*body);
  EXPECT_EQ(j["prompt"], "x");
  EXPECT_EQ(j["seed"], 7);
  EXPECT_EQ(j["stream"], false);
  EXPECT_EQ(j["return_token_ids"], true);
  EXPECT_FALSE(j.contains("stream_options"));
  EXPECT_FALSE(ShadowBody("[1,2]"));
  const std::string keyed =
      R"({"prompt":"x","baton_request_key":"0123456789abcdef0123456789abcdef"})";
  EXPECT_FALSE(Json::parse(*ShadowBody(keyed)).contains("baton_request_key"));
}

TEST(ShadowHelpersTest, FirstDifference) {
  EXPECT_FALSE(FirstDifference({1, 2, 3}, {1, 2, 3}));
  EXPECT_EQ(FirstDifference({1, 2, 3}, {1, 9, 3}), 1u);
  EXPECT_EQ(FirstDifference({1, 2}, {1, 2, 3}), 2u);
  EXPECT_EQ(FirstDifference({}, {4}), 0u);
}

TEST(ShadowHelpersTest, SamplesOneOfEvery) {
  boost::asio::io_context io;
  ShadowComparer every3(io.get_executor(), 3, {}, nullptr, nullptr, nullptr);
  std::vector<bool> got;
  for (int i = 0; i < 7; ++i) got.push_back(every3.Sample());
  EXPECT_EQ(got, (std::vector<bool>{true, false, false, true, false, false, true}));
  ShadowComparer off(io.get_executor(), 0, {}, nullptr, nullptr, nullptr);
  EXPECT_FALSE(off.Sample());
  EXPECT_FALSE(off.Sample());
}

TEST(ShadowHelpersTest, ComparisonsCountOnTheEngineWithoutAnAttempt) {
  EngineOutcomes o;
  o.RecordComparison(kCanaryId, true);
  o.RecordComparison(kCanaryId, false);
  const std::vector<proto::EngineOutcome> s = o.Snapshot();
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].compared, 2u);
  EXPECT_EQ(s[0].disagreed, 1u);
  EXPECT_EQ(s[0].requests, 0u);
}

std::string Plain(int status, const std::string& body) {
  return "HTTP/1.1 " + std::to_string(status) +
         " X\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\nConnection: close\r\n\r\n" + body;
}

// A whole completion answer with `ids`.
std::string Answer(const std::vector<int32_t>& ids) {
  return Plain(
      200, Json{{"id", "cmpl-1"},
                {"object", "text_completion"},
                {"choices", {{{"text", "abc"}, {"finish_reason", "length"}, {"token_ids", ids}}}}}
               .dump());
}

// A streamed completion: one event per id, the last with finish_reason, then [DONE].
std::vector<std::string> StreamEvents(const std::vector<int32_t>& ids) {
  std::vector<std::string> events;
  for (size_t i = 0; i < ids.size(); ++i) {
    Json c = {{"text", "t"}, {"token_ids", {ids[i]}}};
    c["finish_reason"] = i + 1 == ids.size() ? Json("length") : Json(nullptr);
    events.push_back("data: " + Json{{"id", "cmpl-s"}, {"choices", {c}}}.dump() + "\n\n");
  }
  events.push_back("data: [DONE]\n\n");
  return events;
}

class ShadowRouterTest : public ::testing::Test {
 protected:
  // A router whose controller lists the primary (weight 0) and the canary (100 %) on these
  // ports, once its admission has the table.
  void StartRouter(uint16_t primary_port, uint16_t canary_port) {
    Result<proto::Listener> listener = proto::Listener::Bind(io_, dir_.File("controller.sock"));
    ASSERT_TRUE(listener.ok()) << listener.status().ToString();
    listener_.emplace(std::move(*listener));
    RouterOptions options;
    options.listen_port = 0;
    options.controller_socket = dir_.File("controller.sock");
    router_ = std::make_unique<Router>(std::move(options));
    ASSERT_TRUE(router_->Start().ok());
    ASSERT_TRUE(AcceptRouter());
    proto::RouteTable table{.version = 1, .epoch = 1, .pair_state = "canary"};
    table.entries.push_back(Entry(kPrimaryId, proto::EngineRole::kPrimary, primary_port, 0));
    table.entries.push_back(Entry(kCanaryId, proto::EngineRole::kCanary, canary_port, 100));
    ASSERT_TRUE(controller_->Send(table).ok());
    ASSERT_TRUE(WaitFor([&] {
      return router_->admission().Primary().has_value() &&
             router_->admission().IsCanary({Address(canary_port), kCanaryId});
    }));
  }

  static std::string Address(uint16_t port) { return "127.0.0.1:" + std::to_string(port); }
  static proto::RouteEntry Entry(uint64_t id, proto::EngineRole role, uint16_t port,
                                 uint32_t weight) {
    return {.engine_id = id,
            .role = role,
            .http_address = Address(port),
            .ready = true,
            .weight = weight,
            .engine_version = proto::ToString(role)};
  }

  bool AcceptRouter() {
    Result<proto::Channel> channel = listener_->Accept(seconds(20));
    if (!channel.ok()) return false;
    if (!proto::ServerHello(*channel, {.server_name = "fake-controller"}).ok()) return false;
    Result<proto::ReceivedMessage> msg = channel->Receive(seconds(20));
    if (!msg.ok() || !msg->As<proto::Subscribe>().ok()) return false;
    controller_.emplace(std::move(*channel));
    return true;
  }

  HttpReply Post(const Json& body) {
    TestHttpClient client(router_->port());
    return client.Post("/v1/completions", body.dump());
  }

  proto::EngineOutcome Canary() const {
    for (const proto::EngineOutcome& o : router_->outcomes().Snapshot()) {
      if (o.engine_id == kCanaryId) return o;
    }
    return {};
  }
  // Shadows that ended: compared or failed.
  uint64_t Ended() const { return router_->shadows().compared + router_->shadows().failed; }

  proto::testing::TempDir dir_;
  boost::asio::io_context io_;
  std::optional<proto::Listener> listener_;
  std::optional<proto::Channel> controller_;
  std::unique_ptr<Router> router_;  // last: stopped first
};

const Json kSeeded = {{"prompt", "x"}, {"max_tokens", 3}, {"seed", 7}, {"temperature", 0.8}};

TEST_F(ShadowRouterTest, SameIdsAgreeAndTheClientGetsTheCanarysAnswer) {
  ScriptedBackend canary({Answer({5, 6, 7})});
  ScriptedBackend primary({Answer({5, 6, 7})});
  ASSERT_NE(canary.port(), 0);
  ASSERT_NE(primary.port(), 0);
  StartRouter(primary.port(), canary.port());

  const HttpReply reply = Post(kSeeded);
  ASSERT_EQ(reply.status, 200);
  const std::string canary_answer = Answer({5, 6, 7});
  EXPECT_EQ(reply.body, canary_answer.substr(canary_answer.find("\r\n\r\n") + 4));
  ASSERT_TRUE(WaitFor([&] { return Ended() == 1; }));
  EXPECT_EQ(router_->shadows().compared, 1u);
  EXPECT_EQ(Canary().compared, 1u);
  EXPECT_EQ(Canary().disagreed, 0u);
  EXPECT_EQ(Canary().succeeded, 1u);

  ASSERT_EQ(primary.bodies().size(), 1u);  // the shadow: the same request, whole, with ids
  const Json shadow = Json::parse(primary.bodies()[0]);
  EXPECT_EQ(shadow["prompt"], "x");
  EXPECT_EQ(shadow["seed"], 7);
  EXPECT_EQ(shadow["stream"], false);
  EXPECT_EQ(shadow["return_token_ids"], true);

  TestHttpClient client(router_->port());
  const std::string metrics = client.Get("/metrics").body;
  EXPECT_NE(metrics.find("baton_router_engine_compared_total{engine_id=\"2\"} 1\n"),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("baton_router_engine_disagreed_total{engine_id=\"2\"} 0\n"),
            std::string::npos)
      << metrics;
}

// The canary's attempt carries the router's request key (not the one the client wrote); the
// shadow to the primary carries none: it must never claim that request's KV cache.
TEST_F(ShadowRouterTest, TheShadowCarriesNoRequestKey) {
  ScriptedBackend canary({Answer({5, 6, 7})});
  ScriptedBackend primary({Answer({5, 6, 7})});
  StartRouter(primary.port(), canary.port());
  Json body = kSeeded;
  const std::string client_key(32, 'c');
  body["baton_request_key"] = client_key;
  ASSERT_EQ(Post(body).status, 200);
  ASSERT_TRUE(WaitFor([&] { return Ended() == 1; }));
  const Json attempt = Json::parse(canary.bodies().at(0));
  ASSERT_TRUE(attempt["baton_request_key"].is_string()) << attempt;
  EXPECT_TRUE(IsRequestKey(attempt["baton_request_key"].get<std::string>())) << attempt;
  EXPECT_NE(attempt["baton_request_key"], client_key);
  EXPECT_FALSE(Json::parse(primary.bodies().at(0)).contains("baton_request_key"));
}

TEST_F(ShadowRouterTest, DifferentIdsDisagree) {
  ScriptedBackend canary({Answer({5, 6, 7})});
  ScriptedBackend primary({Answer({5, 8, 7})});
  StartRouter(primary.port(), canary.port());

  EXPECT_EQ(Post(kSeeded).status, 200);
  ASSERT_TRUE(WaitFor([&] { return Ended() == 1; }));
  EXPECT_EQ(Canary().compared, 1u);
  EXPECT_EQ(Canary().disagreed, 1u);
  TestHttpClient client(router_->port());
  EXPECT_NE(
      client.Get("/metrics").body.find("baton_router_engine_disagreed_total{engine_id=\"2\"} 1\n"),
      std::string::npos);
}

TEST_F(ShadowRouterTest, AGreedyStreamIsComparedOnTheIdsSentToTheClient) {
  const std::vector<std::string> events = StreamEvents({11, 12, 13});
  ScriptedBackend canary({ScriptedBackend::Stream(events)});
  ScriptedBackend primary({Answer({11, 12, 14})});
  StartRouter(primary.port(), canary.port());

  const Json body = {{"prompt", "x"},
                     {"max_tokens", 3},
                     {"temperature", 0},
                     {"stream", true},
                     {"stream_options", {{"include_usage", true}}}};
  const HttpReply reply = Post(body);
  ASSERT_EQ(reply.status, 200);
  std::string want;
  for (const std::string& e : events) want += e;
  EXPECT_EQ(reply.body, want);  // the canary's stream, byte for byte
  ASSERT_TRUE(WaitFor([&] { return Ended() == 1; }));
  EXPECT_EQ(Canary().compared, 1u);
  EXPECT_EQ(Canary().disagreed, 1u);
  const Json shadow = Json::parse(primary.bodies().at(0));
  EXPECT_EQ(shadow["stream"], false);
  EXPECT_FALSE(shadow.contains("stream_options"));
}

TEST_F(ShadowRouterTest, ARequestWithoutSeedOrGreedyIsNotCompared) {
  ScriptedBackend canary({Answer({5, 6, 7}), Answer({5, 6, 7})});
  ScriptedBackend primary({Answer({5, 6, 7})});
  StartRouter(primary.port(), canary.port());

  EXPECT_EQ(Post({{"prompt", "x"}, {"max_tokens", 3}, {"temperature", 0.8}}).status, 200);
  EXPECT_EQ(Post(kSeeded).status, 200);  // this one is: once it is counted, so was the first
  ASSERT_TRUE(WaitFor([&] { return Ended() == 1; }));
  EXPECT_EQ(router_->shadows().started, 1u);
  EXPECT_EQ(primary.bodies().size(), 1u);
  EXPECT_EQ(Canary().compared, 1u);
  EXPECT_EQ(Canary().succeeded, 2u);
}

TEST_F(ShadowRouterTest, AFailedShadowCountsNothing) {
  ScriptedBackend canary({Answer({5, 6, 7}), Answer({5, 6, 7})});
  ScriptedBackend primary({Plain(500, R"({"error":{"message":"boom","type":"server_error"}})"),
                           Plain(200, R"({"choices":[{"text":"no ids"}]})")});
  StartRouter(primary.port(), canary.port());

  EXPECT_EQ(Post(kSeeded).status, 200);
  ASSERT_TRUE(WaitFor([&] { return router_->shadows().failed == 1; }));
  EXPECT_EQ(Post(kSeeded).status, 200);
  ASSERT_TRUE(WaitFor([&] { return router_->shadows().failed == 2; }));
  EXPECT_EQ(router_->shadows().compared, 0u);
  EXPECT_EQ(Canary().compared, 0u);
  EXPECT_EQ(Canary().disagreed, 0u);
  EXPECT_EQ(Canary().errors, 0u);  // a shadow is no attempt
  for (const proto::EngineOutcome& o : router_->outcomes().Snapshot()) {
    EXPECT_EQ(o.engine_id, kCanaryId) << "the shadow counted on the primary";
  }
}

TEST_F(ShadowRouterTest, AnUnreachablePrimaryCountsNothing) {
  const RefusedLoopbackPort gone;  // a port nothing listens on
  ASSERT_NE(gone.port(), 0);
  ScriptedBackend canary({Answer({5, 6, 7})});
  StartRouter(gone.port(), canary.port());

  EXPECT_EQ(Post(kSeeded).status, 200);
  ASSERT_TRUE(WaitFor([&] { return router_->shadows().failed == 1; }));
  EXPECT_EQ(Canary().compared, 0u);
}

TEST_F(ShadowRouterTest, AtMostFourShadowsAtOnce) {
  std::vector<std::string> answers(ShadowComparer::kMaxInFlight + 1, Answer({5, 6, 7}));
  ScriptedBackend canary(answers);
  LoopbackListener primary;  // accepts nothing: every shadow stays in flight
  StartRouter(primary.port(), canary.port());

  for (size_t i = 0; i < answers.size(); ++i) EXPECT_EQ(Post(kSeeded).status, 200);
  ASSERT_TRUE(WaitFor([&] {
    const ShadowStats s = router_->shadows();
    return s.started + s.busy == answers.size();
  }));
  EXPECT_EQ(router_->shadows().started, ShadowComparer::kMaxInFlight);
  EXPECT_EQ(router_->shadows().busy, 1u);
  EXPECT_EQ(Canary().compared, 0u);
}

// Two real engines of one model (the reference engine's sampling is a pure function of seed,
// position and logits): every seeded or greedy answer, streamed or not, agrees.
class ShadowRealEnginesTest : public ShadowRouterTest {
 protected:
  static void SetUpTestSuite() {
    primary_ = new TinyEngine("baton-shadow-primary");
    canary_ = new TinyEngine("baton-shadow-canary");
  }
  static void TearDownTestSuite() {
    delete canary_;
    delete primary_;
    canary_ = primary_ = nullptr;
  }
  static TinyEngine* primary_;
  static TinyEngine* canary_;
};

TinyEngine* ShadowRealEnginesTest::primary_ = nullptr;
TinyEngine* ShadowRealEnginesTest::canary_ = nullptr;

TEST_F(ShadowRealEnginesTest, SeededAndGreedyAnswersAgree) {
  ASSERT_NE(primary_->port(), 0);
  ASSERT_NE(canary_->port(), 0);
  StartRouter(primary_->port(), canary_->port());
  const Json seeded = {{"model", "tiny"},
                       {"prompt", "Shadowed"},
                       {"max_tokens", 12},
                       {"seed", 41},
                       {"temperature", 1.0}};
  Json greedy = seeded;
  greedy.erase("seed");
  greedy["temperature"] = 0;
  Json streamed = seeded;
  streamed["stream"] = true;
  for (const Json& body : {seeded, greedy, streamed}) EXPECT_EQ(Post(body).status, 200);
  ASSERT_TRUE(WaitFor([&] { return Ended() == 3; }));
  EXPECT_EQ(router_->shadows().failed, 0u);
  EXPECT_EQ(Canary().compared, 3u);
  EXPECT_EQ(Canary().disagreed, 0u);
}

// A canary that refuses what the primary serves (here a model name it lacks) fails: the
// client gets the primary's answer, and the canary's judge hears of an error.
TEST_F(ShadowRouterTest, ACanarys4xxThePrimaryAnswersIsTheCanarysFailure) {
  const std::string missing = R"({"error":{"message":"the model 'm' does not exist",)"
                              R"("code":"model_not_found"}})";
  ScriptedBackend canary({Plain(404, missing)});
  ScriptedBackend primary({Answer({5, 6, 7})});
  StartRouter(primary.port(), canary.port());
  const HttpReply reply = Post({{"prompt", "x"}, {"max_tokens", 3}, {"model", "m"}});
  EXPECT_EQ(reply.status, 200) << reply.body;
  EXPECT_EQ(canary.bodies().size(), 1u);
  EXPECT_EQ(primary.bodies().size(), 1u);
  EXPECT_EQ(Canary().requests, 1u);
  EXPECT_EQ(Canary().errors, 1u);
  EXPECT_EQ(Canary().succeeded, 0u);
}

// A request both refuse was bad: the client gets the primary's 4xx, the canary no error.
TEST_F(ShadowRouterTest, ACanarys4xxThePrimaryRefusesTooIsNoFailure) {
  const std::string bad = R"({"error":{"message":"max_tokens must be positive"}})";
  ScriptedBackend canary({Plain(400, bad)});
  ScriptedBackend primary({Plain(400, bad)});
  StartRouter(primary.port(), canary.port());
  const HttpReply reply = Post({{"prompt", "x"}, {"max_tokens", -1}});
  EXPECT_EQ(reply.status, 400) << reply.body;
  EXPECT_NE(reply.body.find("max_tokens must be positive"), std::string::npos) << reply.body;
  EXPECT_EQ(Canary().requests, 1u);
  EXPECT_EQ(Canary().errors, 0u);
}

// A canary too busy for a request (429) is not wrong: the primary serves it, no error counts.
TEST_F(ShadowRouterTest, ACanarys429IsNoFailure) {
  const std::string busy = R"({"error":{"message":"the KV cache has no room"}})";
  ScriptedBackend canary({Plain(429, busy)});
  ScriptedBackend primary({Answer({5, 6, 7})});
  StartRouter(primary.port(), canary.port());
  EXPECT_EQ(Post({{"prompt", "x"}, {"max_tokens", 3}}).status, 200);
  EXPECT_EQ(Canary().requests, 1u);
  EXPECT_EQ(Canary().errors, 0u);
  EXPECT_TRUE(router_->admission().IsCanary({Address(canary.port()), kCanaryId}));
}

}  // namespace
}  // namespace baton
