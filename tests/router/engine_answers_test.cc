// What the router does with answers and requests it must not take at face value: an engine's
// interim (1xx) response before its final one, an engine that switches protocols, and a
// generating request whose body the router cannot read (it would reach the engine with the
// client's own request key and resume count, and lose lossless replay).
#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "router/router.h"
#include "tests/proto/http/http_test_client.h"
#include "tests/router/scripted_backend.h"

namespace baton {
namespace {

using Json = nlohmann::json;

const std::string kAnswer = R"({"id":"c","choices":[{"text":"hi","finish_reason":"length"}]})";

std::string Final() {
  return "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(kAnswer.size()) + "\r\nConnection: close\r\n\r\n" + kAnswer;
}

std::unique_ptr<Router> RouterTo(uint16_t port) {
  RouterOptions options;
  options.listen_port = 0;
  options.backend = "127.0.0.1:" + std::to_string(port);
  auto router = std::make_unique<Router>(std::move(options));
  Status st = router->Start();
  EXPECT_TRUE(st.ok()) << st.ToString();
  return router;
}

// The client's answer to a request whose engine answers `script`, a response per attempt:
// the final answer, from `attempts` attempts.
void ExpectTheFinalAnswer(std::vector<std::string> script, size_t attempts) {
  ScriptedBackend backend(std::move(script));
  ASSERT_NE(backend.port(), 0);
  std::unique_ptr<Router> router = RouterTo(backend.port());
  TestHttpClient client(router->port());
  const HttpReply r = client.Post("/v1/completions", R"({"prompt":"x","max_tokens":1})");
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Json::parse(r.body, nullptr, false), Json::parse(kAnswer)) << r.body;
  EXPECT_EQ(backend.bodies().size(), attempts);
}

// 103 Early Hints (and an unasked 100) come before the final answer on the same connection
// (RFC 9110 section 15.2): the client gets the final answer, from one attempt.
TEST(EngineAnswersTest, InterimResponsesAreSkippedAndTheFinalOneRelayed) {
  ExpectTheFinalAnswer({"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: "
                        "</style.css>; rel=preload\r\n\r\n" +
                        Final()},
                       1);
}

// 101 Switching Protocols is no answer to a generation: the attempt failed before anything
// reached the client, and the request is retried whole.
TEST(EngineAnswersTest, ASwitchOfProtocolsFailsTheAttempt) {
  ExpectTheFinalAnswer(
      {"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\n", Final()},
      2);
}

// A body that is JSON to a lenient parser (NaN, Infinity, 1e400) but not to RFC 8259, or not
// an object, is refused with 400 and never reaches an engine.
TEST(EngineAnswersTest, AGeneratingBodyTheRouterCannotReadIsRefusedNotForwarded) {
  ScriptedBackend backend({Final()});
  ASSERT_NE(backend.port(), 0);
  std::unique_ptr<Router> router = RouterTo(backend.port());
  for (const std::string body : {R"({"prompt":"x","baton_resume_tokens":5,"temperature":NaN})",
                                 R"({"prompt":"x","temperature":1e400})",
                                 R"({"messages":[],"top_p":Infinity})", "[1]", "", "{not json"}) {
    for (const char* route : {"/v1/completions", "/v1/chat/completions"}) {
      TestHttpClient client(router->port());
      const HttpReply r = client.Post(route, body);
      EXPECT_EQ(r.status, 400) << route << " " << body;
      const Json error = Json::parse(r.body, nullptr, false);
      ASSERT_TRUE(error.is_object()) << r.body;
      EXPECT_EQ(error["error"]["type"], "invalid_request_error") << r.body;
      EXPECT_NE(r.body.find("must be a JSON object"), std::string::npos) << r.body;
    }
  }
  EXPECT_TRUE(backend.bodies().empty()) << "nothing forwarded";
  TestHttpClient client(router->port());
  EXPECT_EQ(client.Post("/v1/completions", R"({"prompt":"x","max_tokens":1})").status, 200);
}

}  // namespace
}  // namespace baton
