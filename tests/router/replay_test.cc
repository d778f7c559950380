// Lossless replay through the router in front of a real baton-refengine: a relay cuts the
// engine's answer at chosen byte offsets (mid-event, mid-chunk), the way an engine that dies
// looks from the router, and the client's stream must equal the uninterrupted one, text and
// token ids, with one id, one prompt_token_ids, and usage counted over the whole request.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "router/router.h"
#include "router/upstream/request_key.h"
#include "tests/proto/http/http_test_client.h"
#include "tests/router/breaking_proxy.h"
#include "tests/router/scripted_backend.h"
#include "tests/standby/tiny_engine.h"

namespace baton {
namespace {

using Json = nlohmann::json;

struct Stream {
  std::vector<Json> events;  // every event before [DONE], parsed
  bool done = false;
  std::string text;
  std::vector<int32_t> ids;
};

// A started router whose only backend is 127.0.0.1:`port`.
std::unique_ptr<Router> RouterTo(uint16_t port, int migration_limit = 3) {
  RouterOptions options;
  options.listen_port = 0;
  options.backend = "127.0.0.1:" + std::to_string(port);
  options.migration_limit = migration_limit;
  auto router = std::make_unique<Router>(std::move(options));
  Status st = router->Start();
  EXPECT_TRUE(st.ok()) << st.ToString();
  return router;
}

class ReplayTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { engine_ = new TinyEngine("baton-replay"); }
  static void TearDownTestSuite() {
    delete engine_;
    engine_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(engine_->port(), 0); }

  static Stream StreamOf(uint16_t port, Json body) {
    body["stream"] = true;
    TestHttpClient client(port);
    Stream s;
    EXPECT_TRUE(client.Send(http::verb::post, "/v1/completions", body.dump()));
    EXPECT_EQ(client.ReadHeader(), 200);
    while (client.ReadMore()) {
    }
    for (const std::string& e : TestHttpClient::SplitEvents(client.body())) {
      if (e == "[DONE]") {
        s.done = true;
        continue;
      }
      Json j = Json::parse(e, nullptr, false);
      EXPECT_TRUE(j.is_object()) << e;
      s.events.push_back(j);
      if (!j.contains("choices") || j["choices"].empty()) continue;
      s.text += j["choices"][0]["text"].get<std::string>();
      for (const Json& id : j["choices"][0]["token_ids"]) s.ids.push_back(id.get<int32_t>());
    }
    return s;
  }

  // One stream as a client sees it: one id, prompt ids once, nothing repeated or missing.
  static void ExpectSameStream(const Stream& got, const Stream& want) {
    ASSERT_TRUE(got.done);
    EXPECT_EQ(got.text, want.text);
    EXPECT_EQ(got.ids, want.ids);
    ASSERT_EQ(got.events.size(), want.events.size());
    int prompt_ids = 0;
    for (const Json& e : got.events) {
      EXPECT_EQ(e["id"], got.events[0]["id"]);
      EXPECT_EQ(e["created"], got.events[0]["created"]);
      if (!e["choices"].empty() && e["choices"][0].contains("prompt_token_ids")) ++prompt_ids;
    }
    EXPECT_EQ(prompt_ids, 1);
    if (want.events.back().contains("usage")) {
      EXPECT_EQ(got.events.back()["usage"], want.events.back()["usage"]);
    }
  }

  static std::string Metrics(uint16_t port) {
    TestHttpClient client(port);
    return client.Get("/metrics").body;
  }

  static TinyEngine* engine_;
};

TinyEngine* ReplayTest::engine_ = nullptr;

const Json kRequest = {{"model", "tiny"},    {"prompt", "Replayed \xC3\xA9 on token ids"},
                       {"max_tokens", 40},   {"seed", 77},
                       {"temperature", 1.0}, {"stream_options", {{"include_usage", true}}}};

TEST_F(ReplayTest, StreamCutAnywhereContinuesExactly) {
  const Stream want = StreamOf(engine_->port(), kRequest);
  ASSERT_EQ(want.ids.size(), 40u);
  // Offsets inside the header, the first event, a later event, and near the end.
  for (size_t cut : {60u, 400u, 1500u, 4000u, 6000u}) {
    SCOPED_TRACE("cut after " + std::to_string(cut) + " bytes");
    BreakingProxy proxy(engine_->port(), cut, 1);
    ASSERT_NE(proxy.port(), 0);
    auto router = RouterTo(proxy.port());
    ExpectSameStream(StreamOf(router->port(), kRequest), want);
    EXPECT_EQ(proxy.broken(), 1);
    EXPECT_EQ(proxy.connections(), 2);
  }
}

TEST_F(ReplayTest, StopStringHeldBackAcrossTheCutStillStops) {
  const Stream plain = StreamOf(engine_->port(), kRequest);
  ASSERT_GE(plain.text.size(), 20u);
  Json request = kRequest;
  // Two ASCII characters from the second half of the text (the rest may be U+FFFD).
  std::string stop;
  for (size_t i = plain.text.size() / 2; i + 1 < plain.text.size() && stop.empty(); ++i) {
    const unsigned char a = plain.text[i], b = plain.text[i + 1];
    if (a >= 0x20 && a < 0x7F && b >= 0x20 && b < 0x7F) stop = plain.text.substr(i, 2);
  }
  if (stop.empty()) GTEST_SKIP() << "no ASCII pair in the generated text: " << plain.text;
  request["stop"] = stop;
  const Stream want = StreamOf(engine_->port(), request);
  for (size_t cut : {1200u, 2500u}) {
    SCOPED_TRACE("cut after " + std::to_string(cut) + " bytes");
    BreakingProxy proxy(engine_->port(), cut, 1);
    auto router = RouterTo(proxy.port());
    ExpectSameStream(StreamOf(router->port(), request), want);
  }
}

// vLLM's min_tokens: a stop string in the text before it does not stop the request, on the
// first attempt or on its replay, which carries min_tokens less the tokens already sent.
TEST_F(ReplayTest, MinTokensCarriesAStreamPastAnEarlyStopAcrossTheCut) {
  const Stream plain = StreamOf(engine_->port(), kRequest);
  ASSERT_GE(plain.text.size(), 20u);
  Json request = kRequest;
  std::string stop;  // one ASCII character from the text's first quarter
  for (size_t i = 1; i < plain.text.size() / 4 && stop.empty(); ++i) {
    const unsigned char a = plain.text[i];
    if (a >= 0x21 && a < 0x7F) stop = plain.text.substr(i, 1);
  }
  if (stop.empty()) GTEST_SKIP() << "no ASCII character early in the text: " << plain.text;
  request["stop"] = stop;
  request["min_tokens"] = 30;
  const Stream want = StreamOf(engine_->port(), request);
  ASSERT_GE(want.ids.size(), 30u) << "the early stop string was not held off";
  for (size_t cut : {1200u, 2500u}) {
    SCOPED_TRACE("cut after " + std::to_string(cut) + " bytes");
    BreakingProxy proxy(engine_->port(), cut, 1);
    auto router = RouterTo(proxy.port());
    ExpectSameStream(StreamOf(router->port(), request), want);
    EXPECT_EQ(proxy.broken(), 1);
  }
}

TEST_F(ReplayTest, SeveralFailuresInARow) {
  const Stream want = StreamOf(engine_->port(), kRequest);
  BreakingProxy proxy(engine_->port(), 2000, 3);
  auto router = RouterTo(proxy.port());
  ExpectSameStream(StreamOf(router->port(), kRequest), want);
  EXPECT_EQ(proxy.broken(), 3);
  EXPECT_NE(Metrics(router->port()).find("baton_router_replays_total{kind=\"replay\"} 3"),
            std::string::npos);
}

TEST_F(ReplayTest, MigrationLimitEndsTheStreamExplicitly) {
  const Stream want = StreamOf(engine_->port(), kRequest);
  BreakingProxy proxy(engine_->port(), 2000, 100);
  auto router = RouterTo(proxy.port(), /*migration_limit=*/2);
  Stream got = StreamOf(router->port(), kRequest);
  ASSERT_TRUE(got.done);
  ASSERT_FALSE(got.events.empty());
  EXPECT_EQ(got.events.back()["error"]["code"], "engine_failed") << got.events.back();
  // What was sent before the end is a prefix of the real output, nothing repeated.
  ASSERT_LE(got.ids.size(), want.ids.size());
  EXPECT_TRUE(std::equal(got.ids.begin(), got.ids.end(), want.ids.begin()));
  EXPECT_EQ(proxy.broken(), 3);
  EXPECT_NE(Metrics(router->port()).find("baton_router_replay_failures_total 1"),
            std::string::npos);
}

TEST_F(ReplayTest, NonStreamedRequestIsRetriedWhole) {
  Json request = kRequest;
  request.erase("stream_options");
  TestHttpClient direct(engine_->port());
  HttpReply want = direct.Post("/v1/completions", request.dump());
  ASSERT_EQ(want.status, 200);
  BreakingProxy proxy(engine_->port(), 300, 1);
  auto router = RouterTo(proxy.port());
  TestHttpClient client(router->port());
  HttpReply got = client.Post("/v1/completions", request.dump());
  ASSERT_EQ(got.status, 200) << got.body;
  EXPECT_EQ(Json::parse(got.body)["choices"], Json::parse(want.body)["choices"]);
  EXPECT_EQ(proxy.broken(), 1);
  EXPECT_NE(Metrics(router->port()).find("baton_router_replays_total{kind=\"retry\"} 1"),
            std::string::npos);
}

TEST_F(ReplayTest, ResumeTokensOutOfRangeIsRefused) {
  Json request = kRequest;
  request["prompt"] = Json::array({1, 2, 3});
  request["baton_resume_tokens"] = 3;
  TestHttpClient client(engine_->port());
  HttpReply r = client.Post("/v1/completions", request.dump());
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(Json::parse(r.body)["error"]["param"], "baton_resume_tokens") << r.body;
}

// A whole JSON response may come chunked: it is relayed once, as JSON, not taken for a
// stream that ended without [DONE] and re-run.
TEST(ReplayScriptTest, ChunkedJsonResponseIsRelayedOnce) {
  const std::string body = R"({"id":"c","choices":[{"text":"hi","finish_reason":"length"}]})";
  const std::string response = ScriptedBackend::Chunked("application/json", {body});
  ScriptedBackend backend({response, response, response, response});
  ASSERT_NE(backend.port(), 0);
  std::unique_ptr<Router> router = RouterTo(backend.port());
  TestHttpClient client(router->port());
  const HttpReply r = client.Post("/v1/completions", R"({"prompt":"x","max_tokens":1})");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(Json::parse(r.body), Json::parse(body)) << r.body;
  EXPECT_EQ(backend.bodies().size(), 1u);
}

// An engine that never ends a chunk-size line cannot grow the router: the attempt ends once
// the read buffer is full (1 MiB sent here, four times the router's bound).
TEST(ReplayScriptTest, AnEndlessChunkLineFromAnEngineEndsTheAttempt) {
  const std::string endless =
      "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
      "1;" +
      std::string(1 << 20, 'a');
  ScriptedBackend backend({endless, endless, endless, endless});
  ASSERT_NE(backend.port(), 0);
  std::unique_ptr<Router> router = RouterTo(backend.port());
  TestHttpClient client(router->port());
  const HttpReply r =
      client.Post("/v1/completions", R"({"prompt":"x","max_tokens":1,"stream":true})");
  EXPECT_NE(r.body.find("buffer overflow"), std::string::npos) << r.status << " " << r.body;
}

}  // namespace
}  // namespace baton

namespace baton {
namespace {

std::string TokenEvent(int token, const char* finish, bool prompt) {
  Json c = {{"index", 0},
            {"text", std::string(1, static_cast<char>('a' + token % 26))},
            {"finish_reason", finish == nullptr ? Json(nullptr) : Json(finish)},
            {"token_ids", {token}}};
  if (prompt) c["prompt_token_ids"] = {1, 2};
  Json j = {{"id", "cmpl-x"}, {"created", 1}, {"model", "m"}, {"seed", 5}, {"choices", {c}}};
  return "data: " + j.dump() + "\n\n";
}

// An engine that fails a stream reports it with an error event and then [DONE], often in one
// read: the router must not take that [DONE], already buffered, as the end of the request.
TEST(ReplayScriptTest, ServerErrorFollowedByDoneIsReplayed) {
  const std::string error =
      R"(data: {"error":{"message":"the engine is shutting down","type":"server_error"}})"
      "\n\n";
  ScriptedBackend backend(
      {ScriptedBackend::Stream({TokenEvent(10, nullptr, true), TokenEvent(11, nullptr, false),
                                error, "data: [DONE]\n\n"}),
       ScriptedBackend::Stream({TokenEvent(12, "length", false), "data: [DONE]\n\n"})});
  ASSERT_NE(backend.port(), 0);
  std::unique_ptr<Router> router = RouterTo(backend.port());
  TestHttpClient client(router->port());
  const Json request = {{"prompt", {1, 2}}, {"max_tokens", 3}, {"seed", 5}, {"stream", true}};
  ASSERT_TRUE(client.Send(http::verb::post, "/v1/completions", request.dump()));
  ASSERT_EQ(client.ReadHeader(), 200);
  while (client.ReadMore()) {
  }
  std::vector<int> ids;
  std::vector<std::string> events = TestHttpClient::SplitEvents(client.body());
  for (const std::string& e : events) {
    if (e == "[DONE]") continue;
    Json j = Json::parse(e);
    ASSERT_FALSE(j.contains("error")) << e;
    ids.push_back(j["choices"][0]["token_ids"][0]);
  }
  EXPECT_EQ(ids, (std::vector<int>{10, 11, 12}));
  EXPECT_EQ(events.back(), "[DONE]");
  const std::vector<std::string> bodies = backend.bodies();
  ASSERT_EQ(bodies.size(), 2u);
  const Json replay = Json::parse(bodies[1]);
  EXPECT_EQ(replay["prompt"], Json({1, 2, 10, 11}));
  EXPECT_EQ(replay["max_tokens"], 1);
  EXPECT_EQ(replay["baton_resume_tokens"], 2);
  EXPECT_EQ(replay["seed"], 5);
}

// An engine killed mid-answer: the stream's bytes so far, no last chunk, the connection closed.
std::string Killed(const std::vector<std::string>& events) {
  const std::string whole = ScriptedBackend::Stream(events);
  return whole.substr(0, whole.size() - std::string("0\r\n\r\n").size());
}

std::string ChatTokenEvent(int token, bool prompt) {
  Json c = {{"index", 0},
            {"delta", {{"content", std::string(1, static_cast<char>('a' + token % 26))}}},
            {"finish_reason", nullptr},
            {"token_ids", {token}}};
  Json j = {{"id", "chat-x"}, {"object", "chat.completion.chunk"},
            {"created", 1},   {"model", "m"},
            {"seed", 5},      {"choices", {c}}};
  if (prompt) j["prompt_token_ids"] = {1, 2};
  return "data: " + j.dump() + "\n\n";
}

// The token ids of a stream through the router, which must end with [DONE].
std::vector<int> StreamIds(uint16_t port, const std::string& route, const Json& body) {
  TestHttpClient client(port);
  EXPECT_TRUE(client.Send(http::verb::post, route, body.dump()));
  EXPECT_EQ(client.ReadHeader(), 200);
  while (client.ReadMore()) {
  }
  std::vector<int> ids;
  const std::vector<std::string> events = TestHttpClient::SplitEvents(client.body());
  EXPECT_FALSE(events.empty());
  if (events.empty()) return ids;
  EXPECT_EQ(events.back(), "[DONE]");
  for (const std::string& e : events) {
    if (e == "[DONE]") continue;
    const Json j = Json::parse(e);
    EXPECT_FALSE(j.contains("error")) << e;
    for (const Json& id : j["choices"][0]["token_ids"]) ids.push_back(id.get<int>());
  }
  return ids;
}

std::string KeyOf(const std::string& body) {
  const Json j = Json::parse(body);
  auto key = j.find("baton_request_key");
  return key != j.end() && key->is_string() ? key->get<std::string>() : "";
}

// How many observations the failover histogram holds.
std::string FailoverCount(uint16_t port) {
  TestHttpClient client(port);
  const std::string metrics = client.Get("/metrics").body;
  const std::string name = "baton_router_failover_next_token_seconds_count ";
  const size_t at = metrics.find(name);
  if (at == std::string::npos) return "missing";
  return metrics.substr(at + name.size(), metrics.find('\n', at) - at - name.size());
}

const Json kSeededStream = {{"prompt", {1, 2}}, {"max_tokens", 3}, {"seed", 5}, {"stream", true}};
const std::string kDone = "data: [DONE]\n\n";

TEST(RequestKeyReplayTest, OneKeyOnEveryAttemptOfARequestAnotherForTheNext) {
  ScriptedBackend backend(
      {Killed({TokenEvent(10, nullptr, true), TokenEvent(11, nullptr, false)}),
       ScriptedBackend::Stream({TokenEvent(12, "length", false), kDone}),
       ScriptedBackend::Stream({TokenEvent(10, nullptr, true), TokenEvent(11, nullptr, false),
                                TokenEvent(12, "length", false), kDone})});
  ASSERT_NE(backend.port(), 0);
  std::unique_ptr<Router> router = RouterTo(backend.port());
  EXPECT_EQ(StreamIds(router->port(), "/v1/completions", kSeededStream),
            (std::vector<int>{10, 11, 12}));
  EXPECT_EQ(StreamIds(router->port(), "/v1/completions", kSeededStream),
            (std::vector<int>{10, 11, 12}));
  const std::vector<std::string> bodies = backend.bodies();
  ASSERT_EQ(bodies.size(), 3u);
  const std::string key = KeyOf(bodies[0]);
  EXPECT_TRUE(IsRequestKey(key)) << bodies[0];
  EXPECT_EQ(Json::parse(bodies[1])["baton_resume_tokens"], 2) << "the second is the replay";
  EXPECT_EQ(KeyOf(bodies[1]), key);
  EXPECT_TRUE(IsRequestKey(KeyOf(bodies[2]))) << bodies[2];
  EXPECT_NE(KeyOf(bodies[2]), key) << "each client request has its own key";
}

TEST(RequestKeyReplayTest, AChatStreamContinuedOnCompletionsKeepsItsKey) {
  ScriptedBackend backend({Killed({ChatTokenEvent(10, true), ChatTokenEvent(11, false)}),
                           ScriptedBackend::Stream({TokenEvent(12, "length", false), kDone})});
  ASSERT_NE(backend.port(), 0);
  std::unique_ptr<Router> router = RouterTo(backend.port());
  const Json chat = {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                     {"max_tokens", 3},
                     {"seed", 5},
                     {"stream", true}};
  EXPECT_EQ(StreamIds(router->port(), "/v1/chat/completions", chat),
            (std::vector<int>{10, 11, 12}));
  const std::vector<std::string> bodies = backend.bodies();
  ASSERT_EQ(bodies.size(), 2u);
  EXPECT_TRUE(IsRequestKey(KeyOf(bodies[0]))) << bodies[0];
  EXPECT_EQ(Json::parse(bodies[1])["prompt"], Json({1, 2, 10, 11})) << "on /v1/completions";
  EXPECT_EQ(KeyOf(bodies[1]), KeyOf(bodies[0]));
}

TEST(RequestKeyReplayTest, AKeyInTheClientsBodyIsReplaced) {
  const std::string answer = ScriptedBackend::Chunked(
      "application/json", {R"({"id":"c","choices":[{"text":"a","finish_reason":"length"}]})"});
  ScriptedBackend backend(
      {ScriptedBackend::Stream({TokenEvent(10, "length", true), kDone}), answer});
  ASSERT_NE(backend.port(), 0);
  std::unique_ptr<Router> router = RouterTo(backend.port());
  const std::string client_key = "0123456789abcdef0123456789abcdef";
  Json streamed = kSeededStream;
  streamed["baton_request_key"] = client_key;
  EXPECT_EQ(StreamIds(router->port(), "/v1/completions", streamed), std::vector<int>{10});
  TestHttpClient client(router->port());
  EXPECT_EQ(client.Post("/v1/completions", R"({"prompt":"x","baton_request_key":42})").status, 200);
  const std::vector<std::string> bodies = backend.bodies();
  ASSERT_EQ(bodies.size(), 2u);
  for (const std::string& body : bodies) {
    EXPECT_TRUE(IsRequestKey(KeyOf(body))) << body;
    EXPECT_NE(KeyOf(body), client_key) << body;
  }
}

// One observation for the request whose stream broke after two tokens and went on; none for
// the request that did not fail before it.
TEST(FailoverNextTokenTest, ObservedOnceAfterAMidStreamFailure) {
  ScriptedBackend backend({ScriptedBackend::Stream({TokenEvent(10, nullptr, true),
                                                    TokenEvent(11, "length", false), kDone}),
                           Killed({TokenEvent(10, nullptr, true), TokenEvent(11, nullptr, false)}),
                           ScriptedBackend::Stream({TokenEvent(12, "length", false), kDone})});
  ASSERT_NE(backend.port(), 0);
  std::unique_ptr<Router> router = RouterTo(backend.port());
  EXPECT_EQ(StreamIds(router->port(), "/v1/completions", kSeededStream),
            (std::vector<int>{10, 11}));
  EXPECT_EQ(FailoverCount(router->port()), "0") << "no failure, no observation";
  EXPECT_EQ(StreamIds(router->port(), "/v1/completions", kSeededStream),
            (std::vector<int>{10, 11, 12}));
  EXPECT_EQ(FailoverCount(router->port()), "1");
}

// A failure before any token was sent is a whole retry, not a continuation: nothing observed.
TEST(FailoverNextTokenTest, NotObservedForAWholeRetry) {
  const std::string error =
      R"(data: {"error":{"message":"the engine is shutting down","type":"server_error"}})"
      "\n\n";
  ScriptedBackend backend({ScriptedBackend::Stream({error, kDone}),
                           ScriptedBackend::Stream({TokenEvent(10, nullptr, true),
                                                    TokenEvent(11, "length", false), kDone})});
  ASSERT_NE(backend.port(), 0);
  std::unique_ptr<Router> router = RouterTo(backend.port());
  EXPECT_EQ(StreamIds(router->port(), "/v1/completions", kSeededStream),
            (std::vector<int>{10, 11}));
  EXPECT_EQ(backend.bodies().size(), 2u);
  EXPECT_EQ(FailoverCount(router->port()), "0");
}

}  // namespace
}  // namespace baton
