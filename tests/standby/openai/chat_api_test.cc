#include "standby/openai/chat_api.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/standby/completion_context_test_base.h"

namespace baton {
namespace {

using Json = nlohmann::json;

class ChatApiTest : public CompletionContextTest {
 protected:
  ParsedCompletion Parse(const Json& body) { return ParseChatCompletionRequest(body.dump(), ctx_); }

  std::vector<int32_t> Ids(const std::string& text) { return tokenizer_->Encode(text, true); }
};

TEST_F(ChatApiTest, TemplateRendersEachMessageThenTheAnswersStart) {
  Result<std::string> prompt = RenderChatPrompt(Json::parse(R"([
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "!"}]},
      {"role": "assistant", "content": null},
      {"role": "user", "content": "Again"}])"));
  ASSERT_TRUE(prompt.ok()) << prompt.status().ToString();
  EXPECT_EQ(*prompt,
            "<|system|>\nBe brief.\n<|user|>\nHi!\n<|assistant|>\n\n<|user|>\nAgain\n"
            "<|assistant|>\n");
}

TEST_F(ChatApiTest, MessagesThatAreNotTextAreRefusedNamingTheMessage) {
  for (const char* bad :
       {R"([])", R"("hi")", R"([{"content": "x"}])", R"([{"role": "wizard", "content": "x"}])",
        R"([{"role": "user", "content": 7}])",
        R"([{"role": "user", "content": [{"type": "image_url"}]}])"}) {
    Result<std::string> prompt = RenderChatPrompt(Json::parse(bad));
    EXPECT_FALSE(prompt.ok()) << bad;
    ParsedCompletion p = Parse({{"messages", Json::parse(bad)}});
    ASSERT_TRUE(p.error.has_value()) << bad;
    EXPECT_EQ(p.error->http_status, 400);
    EXPECT_EQ(p.error->param, "messages");
  }
  EXPECT_NE(RenderChatPrompt(Json::parse(R"([{"role":"user"},{"role":"user","content":1}])"))
                .status()
                .message()
                .find("messages[1]"),
            std::string::npos);
  ParsedCompletion none = Parse({{"prompt", "x"}});
  ASSERT_TRUE(none.error.has_value());
  EXPECT_EQ(none.error->param, "messages");
}

TEST_F(ChatApiTest, PromptIsTheTemplateAndTheLimitDefaultsToTheContextsRoom) {
  ParsedCompletion p = Parse({{"model", "tiny"},
                              {"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                              {"seed", 5},
                              {"stream", true},
                              {"stop", "\n"}});
  ASSERT_FALSE(p.error) << p.error->message;
  EXPECT_TRUE(p.request.chat);
  EXPECT_EQ(p.request.prompt_ids, Ids("<|user|>\nHi\n<|assistant|>\n"));
  EXPECT_EQ(p.request.max_tokens,
            config_.max_position_embeddings - static_cast<int>(p.request.prompt_ids.size()));
  EXPECT_EQ(p.request.seed, 5u);
  EXPECT_TRUE(p.request.stream);
  EXPECT_EQ(p.request.stop, std::vector<std::string>{"\n"});
}

TEST_F(ChatApiTest, MaxCompletionTokensComesBeforeMaxTokens) {
  const Json messages = {{{"role", "user"}, {"content", "Hi"}}};
  ParsedCompletion both =
      Parse({{"messages", messages}, {"max_completion_tokens", 7}, {"max_tokens", 9}});
  ASSERT_FALSE(both.error) << both.error->message;
  EXPECT_EQ(both.request.max_tokens, 7);
  ParsedCompletion old = Parse({{"messages", messages}, {"max_tokens", 9}});
  ASSERT_FALSE(old.error) << old.error->message;
  EXPECT_EQ(old.request.max_tokens, 9);
  ParsedCompletion zero = Parse({{"messages", messages}, {"max_completion_tokens", 0}});
  ASSERT_TRUE(zero.error.has_value());
  EXPECT_EQ(zero.error->param, "max_completion_tokens");
}

// A router continues an interrupted chat stream on /v1/completions with token ids; without a
// limit of the client's, the continuation may use the whole room, as the chat request could.
TEST_F(ChatApiTest, AReplayWithoutALimitMayUseTheWholeRoom) {
  const std::vector<int32_t> ids = Ids("<|user|>\nHi\n<|assistant|>\nab");
  Json replay = {{"prompt", ids}, {"baton_resume_tokens", 2}, {"seed", 1}};
  ParsedCompletion p = ParseCompletionRequest(replay.dump(), ctx_);
  ASSERT_FALSE(p.error) << p.error->message;
  EXPECT_EQ(p.request.max_tokens, config_.max_position_embeddings - static_cast<int>(ids.size()));
  for (const Json& none : {Json(nullptr), Json(0)}) {
    replay["baton_resume_tokens"] = none;
    ParsedCompletion zero = ParseCompletionRequest(replay.dump(), ctx_);
    ASSERT_FALSE(zero.error) << zero.error->message;
    EXPECT_EQ(zero.request.max_tokens, 16) << none;
  }
  replay.erase("baton_resume_tokens");
  ParsedCompletion plain = ParseCompletionRequest(replay.dump(), ctx_);
  ASSERT_FALSE(plain.error) << plain.error->message;
  EXPECT_EQ(plain.request.max_tokens, 16);  // OpenAI's default for completions
}

TEST_F(ChatApiTest, ResponsesHaveOpenAisChatShapesAndTheTokenIds) {
  const CompletionHeader header{"chatcmpl-1", 42, "tiny", 9};
  const std::vector<int32_t> prompt = {256, 'a'};
  Json body = Json::parse(ChatBody(header, "hi", "stop", {'h', 'i'}, prompt, {2, 2}));
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["choices"][0]["message"], (Json{{"role", "assistant"}, {"content", "hi"}}));
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(body["choices"][0]["token_ids"], (Json{'h', 'i'}));
  EXPECT_EQ(body["prompt_token_ids"], Json(prompt));
  EXPECT_EQ(body["usage"]["total_tokens"], 4);

  Json first = Json::parse(ChatChunk(header, "h", "", {'h'}, &prompt));
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"], (Json{{"role", "assistant"}, {"content", "h"}}));
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  EXPECT_EQ(first["prompt_token_ids"], Json(prompt));
  EXPECT_EQ(first["seed"], 9);
  Json next = Json::parse(ChatChunk(header, "i", "length", {'i'}, nullptr));
  EXPECT_EQ(next["choices"][0]["delta"], (Json{{"content", "i"}}));
  EXPECT_EQ(next["choices"][0]["finish_reason"], "length");
  EXPECT_FALSE(next.contains("prompt_token_ids"));
  Json usage = Json::parse(ChatUsageChunk(header, {2, 2}));
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 2);
}

}  // namespace
}  // namespace baton
