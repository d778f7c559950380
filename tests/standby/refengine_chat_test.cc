// Runs the real baton-refengine binary on a generated tiny model and talks to its
// /v1/chat/completions over HTTP: the answer is the completion of the chat template's prompt,
// and a chat stream can be continued on /v1/completions from its token ids, as the router
// does when the engine serving it fails.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "standby/mkmodel/model_writer.h"
#include "standby/openai/chat_api.h"
#include "tests/standby/engine_http.h"
#include "tests/standby/tiny_engine.h"

namespace baton {
namespace {

using Json = nlohmann::json;

class RefEngineChatTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ModelSpec spec = PresetSpec("tiny");
    spec.seed = 11;
    engine_ = new TinyEngine("baton-refengine-chat", {"--kv-blocks", "256"}, spec);
  }
  static void TearDownTestSuite() {
    delete engine_;
    engine_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(engine_->port(), 0); }

  static Json Post(const std::string& route, const Json& body, int want = 200) {
    return PostJson(engine_->port(), route, body, want);
  }

  static std::vector<Json> Stream(const std::string& route, const Json& body) {
    TestHttpClient client(engine_->port());
    return StreamJson(&client, route, body);
  }

  static TinyEngine* engine_;
};

TinyEngine* RefEngineChatTest::engine_ = nullptr;

const Json kChat = {{"model", "tiny"},
                    {"messages",
                     {{{"role", "system"}, {"content", "You are terse."}},
                      {{"role", "user"}, {"content", "Tell me a story"}}}},
                    {"max_completion_tokens", 24},
                    {"seed", 31},
                    {"temperature", 0.9}};

TEST_F(RefEngineChatTest, AnswerIsTheCompletionOfTheTemplatesPrompt) {
  Json chat = Post("/v1/chat/completions", kChat);
  EXPECT_EQ(chat["object"], "chat.completion");
  EXPECT_EQ(chat["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(chat["choices"][0]["message"]["role"], "assistant");
  Result<std::string> prompt = RenderChatPrompt(kChat["messages"]);
  ASSERT_TRUE(prompt.ok());
  Json text = Post("/v1/completions", {{"prompt", chat["prompt_token_ids"]},
                                       {"max_tokens", 24},
                                       {"seed", 31},
                                       {"temperature", 0.9}});
  EXPECT_EQ(chat["choices"][0]["token_ids"], text["choices"][0]["token_ids"]);
  EXPECT_EQ(chat["choices"][0]["message"]["content"], text["choices"][0]["text"]);
  EXPECT_EQ(chat["prompt_token_ids"].size(), prompt->size() + 1);  // bos + the template's bytes
  EXPECT_EQ(chat["usage"]["prompt_tokens"], chat["prompt_token_ids"].size());
}

TEST_F(RefEngineChatTest, StreamedDeltasJoinToTheAnswer) {
  Json whole = Post("/v1/chat/completions", kChat);
  std::vector<Json> events = Stream("/v1/chat/completions", kChat);
  ASSERT_FALSE(events.empty());
  std::string content;
  Json ids = Json::array();
  for (size_t i = 0; i < events.size(); ++i) {
    const Json& c = events[i]["choices"][0];
    EXPECT_EQ(events[i]["object"], "chat.completion.chunk");
    EXPECT_EQ(c["delta"].contains("role"), i == 0);
    EXPECT_EQ(events[i].contains("prompt_token_ids"), i == 0);
    content += c["delta"]["content"].get<std::string>();
    for (const Json& id : c["token_ids"]) ids.push_back(id);
  }
  EXPECT_EQ(events[0]["prompt_token_ids"], whole["prompt_token_ids"]);
  EXPECT_EQ(content, whole["choices"][0]["message"]["content"]);
  EXPECT_EQ(ids, whole["choices"][0]["token_ids"]);
  EXPECT_EQ(events.back()["choices"][0]["finish_reason"], whole["choices"][0]["finish_reason"]);
}

// What the router sends when a chat stream breaks after k tokens: the prompt's ids and the
// k ids sent, on /v1/completions, with baton_resume_tokens = k and no limit of its own when
// the client gave none. The rest is the uninterrupted answer's rest.
TEST_F(RefEngineChatTest, AChatStreamContinuesOnCompletionsFromItsTokenIds) {
  Json unlimited = kChat;
  unlimited.erase("max_completion_tokens");
  unlimited["stop"] = "\n\n";
  Json whole = Post("/v1/chat/completions", unlimited);
  std::vector<int32_t> ids = whole["choices"][0]["token_ids"].get<std::vector<int32_t>>();
  ASSERT_GE(ids.size(), 6u);
  for (size_t k : {1u, 5u}) {
    Json prompt = whole["prompt_token_ids"];
    for (size_t i = 0; i < k; ++i) prompt.push_back(ids[i]);
    Json rest = Post("/v1/completions", {{"prompt", prompt},
                                         {"baton_resume_tokens", k},
                                         {"seed", 31},
                                         {"temperature", 0.9},
                                         {"stop", "\n\n"}});
    EXPECT_EQ(rest["choices"][0]["token_ids"].get<std::vector<int32_t>>(),
              std::vector<int32_t>(ids.begin() + static_cast<long>(k), ids.end()))
        << "after " << k;
    EXPECT_EQ(rest["choices"][0]["finish_reason"], whole["choices"][0]["finish_reason"]);
  }
}

TEST_F(RefEngineChatTest, BadChatRequestsGetJsonErrors) {
  Json no_messages = Post("/v1/chat/completions", {{"prompt", "x"}}, 400);
  EXPECT_EQ(no_messages["error"]["param"], "messages");
  Json image =
      Post("/v1/chat/completions",
           {{"messages", {{{"role", "user"}, {"content", {{{"type", "image_url"}}}}}}}}, 400);
  EXPECT_EQ(image["error"]["param"], "messages[0].content[0].type");
  Json no_content = Post("/v1/chat/completions", {{"messages", {{{"role", "user"}}}}}, 400);
  EXPECT_EQ(no_content["error"]["param"], "messages[0].content");
  Json too_long = Post(
      "/v1/chat/completions",
      {{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"max_completion_tokens", 1 << 20}},
      400);
  EXPECT_EQ(too_long["error"]["param"], "max_completion_tokens");
}

}  // namespace
}  // namespace baton
