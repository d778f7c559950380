#include "standby/openai/chat_api.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

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
      {"role": "assistant", "content": ""},
      {"role": "user", "content": "Again"}])"));
  ASSERT_TRUE(prompt.ok()) << prompt.status().ToString();
  EXPECT_EQ(*prompt,
            "<|system|>\nBe brief.\n<|user|>\nHi!\n<|assistant|>\n\n<|user|>\nAgain\n"
            "<|assistant|>\n");
}

TEST_F(ChatApiTest, MessagesThatAreNotTextAreRefusedNamingTheField) {
  const std::vector<std::pair<const char*, const char*>> cases = {
      {R"([])", "messages"},
      {R"("hi")", "messages"},
      {R"(["hi"])", "messages[0]"},
      {R"([{"role": "wizard", "content": "x"}])", "messages[0].role"},
      {R"([{"role": 3, "content": "x"}])", "messages[0].role"},
      {R"([{"role": "user", "content": 7}])", "messages[0].content"},
      {R"([{"role": "user", "content": []}])", "messages[0].content"},
      {R"([{"role": "user", "content": ["x"]}])", "messages[0].content[0]"},
      {R"([{"role": "user", "content": [{"type": "image_url"}]}])", "messages[0].content[0].type"},
      {R"([{"role": "user", "content": [{"type": "text", "text": 1}]}])",
       "messages[0].content[0].text"},
      {R"([{"role": "user", "content": "a", "name": 5}])", "messages[0].name"},
      {R"([{"role": "user", "content": "a"}, {"role": "tool", "content": "r", "tool_call_id": 9}])",
       "messages[1].tool_call_id"},
      {R"([{"role": "assistant", "content": null, "tool_calls": [{"id": "c"}]}])",
       "messages[0].tool_calls"},
  };
  for (const auto& [bad, param] : cases) {
    EXPECT_FALSE(RenderChatPrompt(Json::parse(bad)).ok()) << bad;
    ParsedCompletion p = Parse({{"messages", Json::parse(bad)}});
    ASSERT_TRUE(p.error.has_value()) << bad;
    EXPECT_EQ(p.error->http_status, 400) << bad;
    EXPECT_EQ(p.error->param, param) << bad;
    EXPECT_EQ(p.error->code, "") << bad;
  }
  EXPECT_NE(RenderChatPrompt(
                Json::parse(R"([{"role":"user","content":"a"},{"role":"user","content":1}])"))
                .status()
                .message()
                .find("messages[1]"),
            std::string::npos);
}

// What OpenAI's API answers 400 "Missing required parameter" to, with the parameter's path
// and the code missing_required_parameter: never a silent default.
TEST_F(ChatApiTest, AMissingFieldIsA400NamingIt) {
  const std::vector<std::pair<Json, const char*>> cases = {
      {Json{{"model", "tiny"}}, "messages"},
      {Json{{"messages", Json::parse(R"([{"content": "x"}])")}}, "messages[0].role"},
      {Json{{"messages", Json::parse(R"([{"role": "user"}])")}}, "messages[0].content"},
      {Json{{"messages", Json::parse(R"([{"role": "user", "content": null}])")}},
       "messages[0].content"},
      {Json{{"messages", Json::parse(R"([{"role": "user", "content": "a"},
                                          {"role": "assistant"}])")}},
       "messages[1].content"},
      {Json{{"messages", Json::parse(R"([{"role": "tool", "content": "r"}])")}},
       "messages[0].tool_call_id"},
      {Json{{"messages", Json::parse(R"([{"role": "user", "content": [{"text": "a"}]}])")}},
       "messages[0].content[0].type"},
  };
  for (const auto& [body, param] : cases) {
    ParsedCompletion p = Parse(body);
    ASSERT_TRUE(p.error.has_value()) << body.dump();
    EXPECT_EQ(p.error->http_status, 400) << body.dump();
    EXPECT_EQ(p.error->param, param) << body.dump();
    EXPECT_EQ(p.error->code, "missing_required_parameter") << body.dump();
    EXPECT_EQ(p.error->message, std::string("Missing required parameter: '") + param + "'.");
  }
  ParsedCompletion tool = Parse({{"messages", Json::parse(R"([{"role": "user", "content": "a"},
      {"role": "tool", "content": "r", "tool_call_id": "c1", "name": "f"}])")}});
  EXPECT_FALSE(tool.error.has_value()) << ErrorBody(*tool.error);
  const Json hi = Json::parse(R"([{"role": "user", "content": "hi"}])");
  ParsedCompletion top = Parse({{"messages", hi}, {"top_logprobs", 5}});
  ASSERT_TRUE(top.error.has_value());
  EXPECT_EQ(top.error->param, "top_logprobs");
  ParsedCompletion range = Parse({{"messages", hi}, {"top_logprobs", 21}});
  ASSERT_TRUE(range.error.has_value());
  EXPECT_EQ(range.error->param, "top_logprobs");
  EXPECT_FALSE(Parse({{"messages", hi}, {"top_logprobs", 0}}).error.has_value());
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
