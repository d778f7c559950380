// EngineOutcomes: the counters by engine, alone and as a router in front of a scripted backend
// fills them (a refusal that is retried, a success, a final 500) and shows them in /metrics.
#include "router/canary/engine_outcomes.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "router/router.h"
#include "tests/proto/http/http_test_client.h"
#include "tests/router/scripted_backend.h"

namespace baton {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;

TEST(EngineOutcomesTest, CountsEachAttemptByEngine) {
  EngineOutcomes o;
  EXPECT_TRUE(o.Snapshot().empty());
  o.RecordSucceeded(7, milliseconds(1500));
  o.RecordSucceeded(7, microseconds(2999));  // whole milliseconds: 2
  o.RecordFailed(7);
  o.RecordEnded(7);
  o.RecordFailed(3);
  const std::vector<proto::EngineOutcome> s = o.Snapshot();
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0],
            (proto::EngineOutcome{
                .engine_id = 3, .requests = 1, .errors = 1, .duration_ms = 0, .succeeded = 0}));
  EXPECT_EQ(s[1],
            (proto::EngineOutcome{
                .engine_id = 7, .requests = 4, .errors = 1, .duration_ms = 1502, .succeeded = 2}));
}

TEST(EngineOutcomesTest, SafeFromManyThreads) {
  EngineOutcomes o;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&o, t] {
      for (int i = 0; i < 1000; ++i) {
        if (i % 10 == 0) {
          o.RecordFailed(static_cast<uint64_t>(t % 2));
        } else {
          o.RecordSucceeded(static_cast<uint64_t>(t % 2), milliseconds(1));
        }
        (void)o.Snapshot();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const std::vector<proto::EngineOutcome> s = o.Snapshot();
  ASSERT_EQ(s.size(), 2u);
  for (const proto::EngineOutcome& e : s) {
    EXPECT_EQ(e.requests, 2000u);
    EXPECT_EQ(e.errors, 200u);
    EXPECT_EQ(e.succeeded, 1800u);
    EXPECT_EQ(e.duration_ms, 1800u);
  }
}

std::string Plain(int status, const std::string& reason, const std::string& body) {
  return "HTTP/1.1 " + std::to_string(status) + " " + reason +
         "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\nConnection: close\r\n\r\n" + body;
}

TEST(EngineOutcomesTest, RouterCountsRetriesSuccessesAndFinal5xx) {
  const std::string ok = R"({"id":"c","choices":[{"text":"hi","finish_reason":"length"}]})";
  const std::string failed = R"({"error":{"message":"boom","type":"server_error"}})";
  ScriptedBackend backend({Plain(503, "Service Unavailable", ""), Plain(200, "OK", ok),
                           Plain(500, "Internal Server Error", failed)});
  ASSERT_NE(backend.port(), 0);
  RouterOptions options;
  options.listen_port = 0;
  options.backend = "127.0.0.1:" + std::to_string(backend.port());  // engine id 0
  Router router(std::move(options));
  ASSERT_TRUE(router.Start().ok());
  {
    TestHttpClient client(router.port());  // 503, retried on the same backend: 200
    EXPECT_EQ(client.Post("/v1/completions", R"({"prompt":"x","max_tokens":1})").status, 200);
  }
  {
    TestHttpClient client(router.port());  // a 500 goes to the client, and counts as failed
    EXPECT_EQ(client.Post("/v1/completions", R"({"prompt":"x","max_tokens":1})").status, 500);
  }
  const std::vector<proto::EngineOutcome> s = router.outcomes().Snapshot();
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].engine_id, 0u);
  EXPECT_EQ(s[0].requests, 3u);
  EXPECT_EQ(s[0].errors, 2u);
  EXPECT_EQ(s[0].succeeded, 1u);

  TestHttpClient client(router.port());
  const HttpReply m = client.Get("/metrics");
  ASSERT_EQ(m.status, 200);
  EXPECT_NE(m.body.find("baton_router_engine_requests_total{engine_id=\"0\"} 3\n"),
            std::string::npos)
      << m.body;
  EXPECT_NE(m.body.find("baton_router_engine_errors_total{engine_id=\"0\"} 2\n"), std::string::npos)
      << m.body;
}

}  // namespace
}  // namespace baton
