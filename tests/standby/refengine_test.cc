// Runs the real baton-refengine binary, standalone, on a generated tiny model and talks to it
// over HTTP.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "standby/mkmodel/model_writer.h"
#include "standby/openai/completions_api.h"
#include "tests/proto/http/http_test_client.h"
#include "tests/standby/engine_http.h"
#include "tests/standby/tiny_engine.h"

namespace baton {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

class RefEngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ModelSpec spec = PresetSpec("tiny");
    spec.seed = 11;
    engine_ = new TinyEngine("baton-refengine", {"--kv-blocks", "512", "--max-batch", "8"}, spec);
  }
  static void TearDownTestSuite() {
    delete engine_;
    engine_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(engine_->port(), 0); }

  static uint16_t port() { return engine_->port(); }

  static Json Complete(const Json& body, uint16_t to = port()) {
    return PostJson(to, "/v1/completions", body);
  }

  // The stream's JSON events; checks the framing and the [DONE] terminator.
  static std::vector<Json> Stream(TestHttpClient* client, const Json& body) {
    return StreamJson(client, "/v1/completions", body);
  }

  static std::vector<Json> ParseEvents(const std::string& body) { return ParseSseJson(body); }

  static std::string Metrics(uint16_t to = port()) {
    TestHttpClient client(to);
    return client.Get("/metrics").body;
  }

  static TinyEngine* engine_;
};

TinyEngine* RefEngineTest::engine_ = nullptr;

std::vector<int32_t> Ids(const Json& array) { return array.get<std::vector<int32_t>>(); }

// The value of a Prometheus sample line `name value`.
double Sample(const std::string& metrics, const std::string& name) {
  const size_t at = metrics.find("\n" + name + " ");
  if (at == std::string::npos) return -1;
  return std::stod(metrics.substr(at + name.size() + 2));
}

TEST_F(RefEngineTest, NonStreamedCompletionCarriesTokenIds) {
  Json r = Complete({{"model", "tiny"}, {"prompt", "Hello"}, {"max_tokens", 12}, {"seed", 3}});
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["model"], "tiny");
  EXPECT_EQ(r["seed"], 3);
  EXPECT_EQ(r["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  const Json& c = r["choices"][0];
  EXPECT_EQ(Ids(c["prompt_token_ids"]),
            (std::vector<int32_t>{kBosTokenId, 'H', 'e', 'l', 'l', 'o'}));
  const std::vector<int32_t> ids = Ids(c["token_ids"]);
  ASSERT_FALSE(ids.empty());
  EXPECT_TRUE(c["finish_reason"] == "length" ? ids.size() == 12 : c["finish_reason"] == "stop");
  std::string bytes;
  for (int32_t id : ids) {
    if (id < 256) bytes += static_cast<char>(id);
  }
  EXPECT_EQ(c["text"], LenientUtf8(bytes));
  EXPECT_EQ(r["usage"]["prompt_tokens"], 6);
  EXPECT_EQ(r["usage"]["completion_tokens"], ids.size());
}

TEST_F(RefEngineTest, StreamedEventsJoinToTheNonStreamedCompletion) {
  const Json body = {
      {"prompt", "The quick brown fox"}, {"max_tokens", 40}, {"seed", 99}, {"temperature", 0.9}};
  Json whole = Complete(body);
  TestHttpClient client(port());
  std::vector<Json> events = Stream(&client, body);
  ASSERT_FALSE(events.empty());
  std::string text;
  std::vector<int32_t> ids;
  for (size_t i = 0; i < events.size(); ++i) {
    const Json& c = events[i]["choices"][0];
    EXPECT_EQ(c.contains("prompt_token_ids"), i == 0);
    ASSERT_EQ(c["token_ids"].size(), 1u);  // one event per generated token
    ids.push_back(c["token_ids"][0]);
    text += c["text"].get<std::string>();
    EXPECT_EQ(c["finish_reason"].is_null(), i + 1 < events.size());
    EXPECT_EQ(events[i]["seed"], 99);
  }
  EXPECT_EQ(events[0]["choices"][0]["prompt_token_ids"], whole["choices"][0]["prompt_token_ids"]);
  EXPECT_EQ(ids, Ids(whole["choices"][0]["token_ids"]));
  EXPECT_EQ(text, whole["choices"][0]["text"]);
  EXPECT_EQ(events.back()["choices"][0]["finish_reason"], whole["choices"][0]["finish_reason"]);
  EXPECT_EQ(client.Get("/health").status, 200);  // keep-alive after the stream
}

TEST_F(RefEngineTest, ReplayOnTokenIdsContinuesIdentically) {
  const Json body = {{"prompt", "Once upon a time"},
                     {"max_tokens", 30},
                     {"seed", 1234},
                     {"temperature", 1.0},
                     {"top_p", 0.95}};
  Json whole = Complete(body);
  const std::vector<int32_t> prompt = Ids(whole["choices"][0]["prompt_token_ids"]);
  const std::vector<int32_t> ids = Ids(whole["choices"][0]["token_ids"]);
  ASSERT_GE(ids.size(), 12u);
  for (size_t k : {1u, 5u, 11u}) {
    std::vector<int32_t> replay_prompt = prompt;
    replay_prompt.insert(replay_prompt.end(), ids.begin(), ids.begin() + k);
    Json replay = body;
    replay["prompt"] = replay_prompt;
    replay["max_tokens"] = 30 - static_cast<int>(k);
    Json rest = Complete(replay);
    EXPECT_EQ(Ids(rest["choices"][0]["token_ids"]),
              std::vector<int32_t>(ids.begin() + k, ids.end()))
        << "replay after " << k << " tokens";
    EXPECT_EQ(rest["choices"][0]["finish_reason"], whole["choices"][0]["finish_reason"]);
  }
}

TEST_F(RefEngineTest, ChosenSeedIsReturnedAndReproducesTheCompletion) {
  Json first = Complete({{"prompt", "seedless"}, {"max_tokens", 16}});
  ASSERT_TRUE(first["seed"].is_number_integer());
  Json again = Complete({{"prompt", "seedless"}, {"max_tokens", 16}, {"seed", first["seed"]}});
  EXPECT_EQ(again["choices"][0]["token_ids"], first["choices"][0]["token_ids"]);
}

TEST_F(RefEngineTest, ConcurrentRequestsAreBatchedAndMatchTheirSoloRuns) {
  // An engine of its own that paces its steps (one every 5 ms): the long stream lasts seconds
  // however fast the machine is, so the others share its steps even when they arrive late.
  ModelSpec spec = PresetSpec("tiny");
  spec.seed = 11;
  const TinyEngine paced("baton-refengine-paced",
                         {"--kv-blocks", "512", "--max-batch", "8", "--step-interval-ms", "5"},
                         spec);
  const uint16_t to = paced.port();
  ASSERT_NE(to, 0);
  std::vector<Json> bodies;
  for (int i = 0; i < 4; ++i) {
    bodies.push_back({{"prompt", "request number " + std::to_string(i)},
                      {"max_tokens", i == 0 ? 480 : 24 + 8 * i},
                      {"seed", 500 + i},
                      {"temperature", 0.8}});
  }
  std::vector<Json> solo;
  for (const Json& b : bodies) solo.push_back(Complete(b, to)["choices"][0]);
  const std::string before = Metrics(to);

  // The long request streams; once its first token is out, the others arrive while it runs.
  TestHttpClient a(to);
  Json stream_body = bodies[0];
  stream_body["stream"] = true;
  ASSERT_TRUE(a.Send(http::verb::post, "/v1/completions", stream_body.dump()));
  ASSERT_EQ(a.ReadHeader(), 200);
  ASSERT_TRUE(a.ReadEvents(1));
  std::vector<Json> together(4);
  std::vector<std::thread> threads;
  for (int i = 1; i < 4; ++i) {
    threads.emplace_back([&, i] { together[i] = Complete(bodies[i], to)["choices"][0]; });
  }
  for (std::thread& t : threads) t.join();
  while (a.ReadMore()) {
  }
  std::vector<int32_t> streamed;
  for (const Json& e : ParseEvents(a.body())) streamed.push_back(e["choices"][0]["token_ids"][0]);
  EXPECT_EQ(streamed, Ids(solo[0]["token_ids"]));
  for (int i = 1; i < 4; ++i) {
    EXPECT_EQ(together[i]["token_ids"], solo[i]["token_ids"]) << "request " << i;
    EXPECT_EQ(together[i]["text"], solo[i]["text"]) << "request " << i;
  }
  // Some step ran more than one sequence.
  const std::string after = Metrics(to);
  const std::string single = "baton_engine_batch_size_bucket{le=\"1\"}";
  const double multi_before =
      Sample(before, "baton_engine_batch_size_count") - Sample(before, single);
  const double multi_after = Sample(after, "baton_engine_batch_size_count") - Sample(after, single);
  EXPECT_GT(multi_after, multi_before) << after;
}

TEST_F(RefEngineTest, StopStringEndsTheCompletion) {
  Json whole = Complete({{"prompt", "stop here"}, {"max_tokens", 64}, {"seed", 8}});
  const std::vector<int32_t> ids = Ids(whole["choices"][0]["token_ids"]);
  size_t k = 1;
  while (k < ids.size() && !(ids[k] >= 'a' && ids[k] <= 'z')) ++k;
  if (k == ids.size()) GTEST_SKIP() << "no lowercase letter generated to stop on";
  const std::string stop(1, static_cast<char>(ids[k]));
  Json cut = Complete({{"prompt", "stop here"}, {"max_tokens", 64}, {"seed", 8}, {"stop", stop}});
  std::string bytes;
  size_t end = 0;
  while (end < ids.size() && !(end > 0 && ids[end] == ids[k])) {
    if (ids[end] < 256) bytes += static_cast<char>(ids[end]);
    ++end;
  }
  if (ids[0] == ids[k]) GTEST_SKIP() << "the stop letter is also the first token";
  EXPECT_EQ(cut["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(cut["choices"][0]["text"], LenientUtf8(bytes));
  EXPECT_EQ(Ids(cut["choices"][0]["token_ids"]),
            std::vector<int32_t>(ids.begin(), ids.begin() + end + 1));
  // The stop string completes on the last token max_tokens allows: a stop, as in vLLM.
  Json last =
      Complete({{"prompt", "stop here"}, {"max_tokens", end + 1}, {"seed", 8}, {"stop", stop}});
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(last["choices"][0]["text"], LenientUtf8(bytes));
}

// vLLM's min_tokens: stop strings are looked for from the token after the first min_tokens
// on, and a stop id ends the request without its text.
TEST_F(RefEngineTest, MinTokensAndStopIdsAsVllmHasThem) {
  const Json base = {{"prompt", "min tokens"}, {"max_tokens", 24}, {"temperature", 0}};
  Json whole = Complete(base);
  const std::vector<int32_t> ids = Ids(whole["choices"][0]["token_ids"]);
  size_t k = 0;
  while (k < ids.size() && !(ids[k] >= 'a' && ids[k] <= 'z')) ++k;
  if (k == ids.size()) GTEST_SKIP() << "no lowercase letter generated to stop on";
  const std::string letter(1, static_cast<char>(ids[k]));
  for (const size_t min_tokens : {k + 1, k}) {
    Json body = base;
    body["stop"] = letter;
    body["min_tokens"] = min_tokens;
    const Json c = Complete(body)["choices"][0];
    const bool stopped_at_k = c["finish_reason"] == "stop" && Ids(c["token_ids"]).size() == k + 1;
    EXPECT_EQ(stopped_at_k, min_tokens == k) << "min_tokens " << min_tokens << ": " << c;
  }
  Json by_id = base;
  by_id["stop_token_ids"] = {ids[k]};
  const Json c = Complete(by_id)["choices"][0];
  EXPECT_EQ(c["finish_reason"], "stop");
  EXPECT_EQ(Ids(c["token_ids"]), std::vector<int32_t>(ids.begin(), ids.begin() + k + 1));
  std::string before;
  for (size_t i = 0; i < k; ++i) {
    if (ids[i] < 256) before += static_cast<char>(ids[i]);
  }
  EXPECT_EQ(c["text"], LenientUtf8(before)) << "the stop id's text is left out";
}

TEST_F(RefEngineTest, BadRequestsGetJsonErrorsAndTheServerStaysUp) {
  TestHttpClient client(port());
  auto error_of = [](const HttpReply& r) {
    Json j = Json::parse(r.body, nullptr, false);
    return j.is_discarded() ? Json() : j["error"];
  };
  HttpReply bad_json = client.Post("/v1/completions", "{not json");
  EXPECT_EQ(bad_json.status, 400);
  EXPECT_TRUE(error_of(bad_json).contains("message"));
  Json long_prompt = Json::array();
  for (int i = 0; i < 600; ++i) long_prompt.push_back(65);
  HttpReply too_long = client.Post("/v1/completions", Json{{"prompt", long_prompt}}.dump());
  EXPECT_EQ(too_long.status, 400);
  EXPECT_EQ(error_of(too_long)["param"], "prompt");
  HttpReply too_many =
      client.Post("/v1/completions", Json{{"prompt", "x"}, {"max_tokens", 100000}}.dump());
  EXPECT_EQ(too_many.status, 400);
  EXPECT_EQ(error_of(too_many)["param"], "max_tokens");
  EXPECT_EQ(client.Post("/v1/completions", Json{{"prompt", "x"}, {"model", "gpt"}}.dump()).status,
            404);
  EXPECT_EQ(client.Get("/v1/nothing").status, 404);
  EXPECT_EQ(client.Get("/v1/completions").status, 405);
  {
    TestHttpClient big(port());
    HttpReply huge = big.Post("/v1/completions", std::string(33 << 20, ' '));  // past 32 MiB
    EXPECT_EQ(huge.status, 413);
    EXPECT_TRUE(error_of(huge).contains("message"));
  }
  TestHttpClient after(port());
  EXPECT_EQ(after.Get("/health").body, R"({"status":"ok"})");
  EXPECT_EQ(Complete({{"prompt", "still here"},
                      {"max_tokens", 2},
                      {"temperature", 0}})["choices"][0]["token_ids"]
                .size(),
            2u);
}

TEST_F(RefEngineTest, ClientLeavingMidStreamDoesNotHurtTheServer) {
  {
    TestHttpClient client(port());
    ASSERT_TRUE(client.Send(http::verb::post, "/v1/completions",
                            Json{{"prompt", "bye"}, {"max_tokens", 300}, {"stream", true}}.dump()));
    ASSERT_EQ(client.ReadHeader(), 200);
    ASSERT_TRUE(client.ReadEvents(1));
    client.Close();
  }
  // ignore_eos: the sampled answer may otherwise end at an eos before its third token.
  EXPECT_EQ(
      Complete(
          {{"prompt", "next"}, {"max_tokens", 3}, {"ignore_eos", true}})["choices"][0]["token_ids"]
          .size(),
      3u);
}

TEST_F(RefEngineTest, HealthModelsAndMetrics) {
  TestHttpClient client(port());
  HttpReply health = client.Get("/health");
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(health.body, R"({"status":"ok"})");
  Json models = Json::parse(client.Get("/v1/models").body);
  EXPECT_EQ(models["data"][0]["id"], "tiny");
  EXPECT_EQ(models["data"][0]["max_model_len"], 512);
  // Sampled without a seed, so it may end early at the end-of-sequence token: the counter
  // must grow by what the answer says it generated. The counters belong to the process, which
  // earlier tests in the same run may have used.
  const double generated_before =
      std::max(0.0, Sample(client.Get("/metrics").body, "baton_engine_generated_tokens_total"));
  const Json done = Complete({{"prompt", "m"}, {"max_tokens", 4}});
  const int generated = done["usage"]["completion_tokens"].get<int>();
  ASSERT_GE(generated, 1);
  const std::string metrics = client.Get("/metrics").body;
  for (const char* name :
       {"baton_engine_http_responses_total{code=\"200\"}", "baton_engine_generated_tokens_total",
        "baton_engine_prompt_tokens_total", "baton_engine_running_requests",
        "baton_engine_waiting_requests", "baton_engine_step_seconds_bucket",
        "baton_engine_batch_size_count", "baton_engine_time_to_first_token_seconds_count"}) {
    EXPECT_NE(metrics.find(name), std::string::npos) << name;
  }
  EXPECT_EQ(Sample(metrics, "baton_engine_generated_tokens_total") - generated_before, generated);
  EXPECT_EQ(Sample(metrics, "baton_engine_serving"), 1);
}

TEST_F(RefEngineTest, LogTellsTheColdStartPhases) {
  const std::string log = engine_->log();
  for (const char* phase : {"weights loaded:", "model ready:", "listening on 127.0.0.1:"}) {
    const size_t at = log.find(phase);
    ASSERT_NE(at, std::string::npos) << phase << "\n" << log;
    EXPECT_NE(log.find("ms since start", at), std::string::npos) << phase;
  }
}

// A KV cache of 6 blocks (96 tokens) holds one of these requests at a time: the others wait
// or are preempted and recomputed, and still produce what they produce alone.
TEST(RefEngineSmallCacheTest, PreemptedAndQueuedRequestsMatchTheirSoloRuns) {
  std::string pattern = (fs::temp_directory_path() / "baton-refengine-small-XXXXXX").string();
  const std::string dir = ::mkdtemp(pattern.data());
  ASSERT_TRUE(WriteModel(PresetSpec("tiny"), dir + "/model").ok());
  {
    EngineProcess engine(dir, {"--model", dir + "/model", "--served-model-name", "tiny",
                               "--kv-blocks", "6", "--block-tokens", "16"});
    ASSERT_NE(engine.port(), 0);
    auto complete = [&](const Json& body) {
      TestHttpClient client(engine.port());
      HttpReply reply = client.Post("/v1/completions", body.dump());
      EXPECT_EQ(reply.status, 200) << reply.body;
      return Json::parse(reply.body)["choices"][0];
    };
    std::vector<Json> bodies, solo;
    for (int i = 0; i < 4; ++i) {
      bodies.push_back({{"prompt", "small " + std::to_string(i)},
                        {"max_tokens", 50 + i},
                        {"seed", i},
                        {"temperature", 1.0}});
      solo.push_back(complete(bodies.back()));
    }
    std::vector<Json> together(4);
    std::vector<std::thread> threads;
    for (int i = 0; i < 4; ++i) threads.emplace_back([&, i] { together[i] = complete(bodies[i]); });
    for (std::thread& t : threads) t.join();
    for (int i = 0; i < 4; ++i) EXPECT_EQ(together[i], solo[i]) << "request " << i;

    TestHttpClient client(engine.port());
    HttpReply too_big =
        client.Post("/v1/completions", Json{{"prompt", "x"}, {"max_tokens", 200}}.dump());
    EXPECT_EQ(too_big.status, 400) << too_big.body;
    EXPECT_NE(too_big.body.find("kv blocks"), std::string::npos) << too_big.body;
    EXPECT_EQ(engine.Stop(), 0) << engine.log();
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
}

}  // namespace
}  // namespace baton
