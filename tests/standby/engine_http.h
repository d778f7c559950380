// Test helpers for an engine's OpenAI routes over HTTP (tests of baton-refengine): a POST
// whose JSON answer is checked and parsed, and a stream read to its end and cut into its JSON
// events. Header-only; one thread per client.
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/proto/http/http_test_client.h"

namespace baton {

// The JSON events of a server-sent-event body, checking that it ends with [DONE] (not
// included).
inline std::vector<nlohmann::json> ParseSseJson(const std::string& body) {
  std::vector<std::string> raw = TestHttpClient::SplitEvents(body);
  EXPECT_FALSE(raw.empty());
  if (raw.empty()) return {};
  EXPECT_EQ(raw.back(), "[DONE]");
  std::vector<nlohmann::json> events;
  for (size_t i = 0; i + 1 < raw.size(); ++i) events.push_back(nlohmann::json::parse(raw[i]));
  return events;
}

// POSTs `body` to `route` on `port`; expects status `want` and a JSON answer, returned.
inline nlohmann::json PostJson(uint16_t port, const std::string& route, const nlohmann::json& body,
                               int want = 200) {
  TestHttpClient client(port);
  HttpReply reply = client.Post(route, body.dump());
  EXPECT_EQ(reply.status, want) << reply.body << reply.error;
  nlohmann::json j = nlohmann::json::parse(reply.body, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << reply.body;
  return j;
}

// POSTs `body` with "stream": true to `route` on `client`'s connection and reads the whole
// stream; its JSON events.
inline std::vector<nlohmann::json> StreamJson(TestHttpClient* client, const std::string& route,
                                              nlohmann::json body) {
  body["stream"] = true;
  EXPECT_TRUE(client->Send(http::verb::post, route, body.dump()));
  EXPECT_EQ(client->ReadHeader(), 200);
  while (client->ReadMore()) {
  }
  return ParseSseJson(client->body());
}

}  // namespace baton
