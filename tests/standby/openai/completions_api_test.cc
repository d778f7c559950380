#include "standby/openai/completions_api.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "standby/openai/request_fields.h"
#include "tests/standby/completion_context_test_base.h"

namespace baton {
namespace {

using Json = nlohmann::json;

class CompletionsApiTest : public CompletionContextTest {
 protected:
  ParsedCompletion Parse(const std::string& body) { return ParseCompletionRequest(body, ctx_); }

  // The refusal's status and param; fails the test when the body is accepted.
  std::pair<int, std::string> Refusal(const std::string& body) {
    ParsedCompletion p = Parse(body);
    EXPECT_TRUE(p.error.has_value()) << body;
    if (!p.error) return {0, ""};
    return {p.error->http_status, p.error->param};
  }
};

TEST_F(CompletionsApiTest, TextPromptIsBytesAfterBos) {
  ParsedCompletion p = Parse(R"({"model":"tiny","prompt":"Hi"})");
  ASSERT_FALSE(p.error) << p.error->message;
  EXPECT_EQ(p.request.prompt_ids, (std::vector<int32_t>{kBosTokenId, 'H', 'i'}));
  EXPECT_EQ(p.request.max_tokens, 16);
  EXPECT_FLOAT_EQ(p.request.temperature, 1.0f);
  EXPECT_FLOAT_EQ(p.request.top_p, 1.0f);
  EXPECT_FALSE(p.request.seed_given);
  EXPECT_EQ(p.request.seed, 777u);  // the random seed chosen for this request
  EXPECT_FALSE(p.request.stream);
  EXPECT_EQ(p.request.model, "tiny");
}

TEST_F(CompletionsApiTest, IdPromptsAndBatchesOfOne) {
  ParsedCompletion ids = Parse(R"({"prompt":[1,2,259],"seed":5,"temperature":0,"top_p":0.5,
                                   "max_tokens":3,"stream":true,"return_token_ids":true})");
  ASSERT_FALSE(ids.error) << ids.error->message;
  EXPECT_EQ(ids.request.prompt_ids, (std::vector<int32_t>{1, 2, 259}));
  EXPECT_EQ(ids.request.seed, 5u);
  EXPECT_TRUE(ids.request.seed_given);
  EXPECT_FLOAT_EQ(ids.request.temperature, 0.0f);
  EXPECT_FLOAT_EQ(ids.request.top_p, 0.5f);
  EXPECT_EQ(ids.request.max_tokens, 3);
  EXPECT_TRUE(ids.request.stream);
  EXPECT_EQ(Parse(R"({"prompt":[[7,8]]})").request.prompt_ids, (std::vector<int32_t>{7, 8}));
  EXPECT_EQ(Parse(R"({"prompt":["A"]})").request.prompt_ids,
            (std::vector<int32_t>{kBosTokenId, 'A'}));
  EXPECT_EQ(Parse(R"({"prompt":[9]})").request.prompt_ids, (std::vector<int32_t>{9}));
}

TEST_F(CompletionsApiTest, SeedIsAny64BitInteger) {
  EXPECT_EQ(Parse(R"({"prompt":"a","seed":18446744073709551615})").request.seed, UINT64_MAX);
  EXPECT_EQ(Parse(R"({"prompt":"a","seed":-1})").request.seed, UINT64_MAX);
  EXPECT_EQ(Parse(R"({"prompt":"a","seed":0})").request.seed, 0u);
}

TEST_F(CompletionsApiTest, RefusesMalformedBodies) {
  EXPECT_EQ(Refusal("{bad").first, 400);
  EXPECT_EQ(Refusal("[1,2]").first, 400);
  EXPECT_EQ(Refusal("{}"), std::make_pair(400, std::string("prompt")));
  EXPECT_EQ(Parse(R"({"model":"tiny"})").error->code, "missing_required_parameter");
  EXPECT_EQ(Parse(R"({"prompt":null})").error->code, "missing_required_parameter");
  EXPECT_EQ(Parse(R"({"prompt":7})").error->code, "") << "there, but wrong";
  EXPECT_EQ(Refusal(R"({"prompt":7})").second, "prompt");
  EXPECT_EQ(Refusal(R"({"prompt":[]})").second, "prompt");
  EXPECT_EQ(Refusal(R"({"prompt":["a","b"]})").second, "prompt");
  EXPECT_EQ(Refusal(R"({"prompt":[1,"b"]})").second, "prompt");
  EXPECT_EQ(Refusal(R"({"prompt":[260]})").second, "prompt");
  EXPECT_EQ(Refusal(R"({"prompt":[-1]})").second, "prompt");
  EXPECT_EQ(Refusal(R"({"prompt":[18446744073709551615]})").second, "prompt");
  EXPECT_EQ(Refusal(R"({"prompt":"a","model":"other"})"),
            std::make_pair(404, std::string("model")));
  EXPECT_EQ(Refusal(R"({"prompt":"a","model":3})").second, "model");
  const std::string deep =
      R"({"prompt":)" + std::string(50000, '[') + "1" + std::string(50000, ']') + "}";
  EXPECT_EQ(Refusal(deep).first, 400);
}

TEST_F(CompletionsApiTest, RefusesParametersOutOfRange) {
  EXPECT_EQ(Refusal(R"({"prompt":"a","max_tokens":0})").second, "max_tokens");
  EXPECT_EQ(Refusal(R"({"prompt":"a","max_tokens":1.5})").second, "max_tokens");
  EXPECT_EQ(Refusal(R"({"prompt":"a","max_tokens":"3"})").second, "max_tokens");
  EXPECT_EQ(Refusal(R"({"prompt":"a","temperature":-0.1})").second, "temperature");
  EXPECT_EQ(Refusal(R"({"prompt":"a","temperature":2.5})").second, "temperature");
  EXPECT_EQ(Refusal(R"({"prompt":"a","top_p":0})").second, "top_p");
  EXPECT_EQ(Refusal(R"({"prompt":"a","top_p":1.01})").second, "top_p");
  EXPECT_EQ(Refusal(R"({"prompt":"a","seed":"x"})").second, "seed");
  EXPECT_EQ(Refusal(R"({"prompt":"a","seed":1.5})").second, "seed");
  EXPECT_EQ(Refusal(R"({"prompt":"a","stream":1})").second, "stream");
  EXPECT_EQ(Refusal(R"({"prompt":"a","stream_options":3})").second, "stream_options");
  EXPECT_EQ(Refusal(R"({"prompt":"a","n":2})").second, "n");
  EXPECT_EQ(Refusal(R"({"prompt":"a","logprobs":3})").second, "logprobs");
  EXPECT_EQ(Refusal(R"({"prompt":"a","echo":true})").second, "echo");
  EXPECT_EQ(Refusal(R"({"prompt":"a","stop":3})").second, "stop");
  EXPECT_EQ(Refusal(R"({"prompt":"a","stop":[""]})").second, "stop");
  EXPECT_EQ(Refusal(R"({"prompt":"a","stop":["a","b","c","d","e"]})").second, "stop");
  EXPECT_FALSE(Parse(R"({"prompt":"a","n":1,"logprobs":null,"echo":false,"stop":null,
                         "temperature":null,"extra_field":{"x":1}})")
                   .error);
}

// OpenAI parameters this engine does not implement: a wrong type or range is a 400 as on
// OpenAI's API, and so is any value that would change the answer, rather than be ignored.
TEST_F(CompletionsApiTest, ParametersItDoesNotImplementAreRefusedUnlessTheyChangeNothing) {
  for (const char* bad :
       {R"("presence_penalty":0.5)", R"("presence_penalty":3)", R"("presence_penalty":"x")",
        R"("frequency_penalty":-2.5)", R"("frequency_penalty":1)", R"("logit_bias":[1])",
        R"("logit_bias":{"65":5})", R"("tools":{})", R"("tools":[{"type":"function"}])",
        R"("functions":[{}])", R"("tool_choice":"auto")", R"("response_format":"json")",
        R"("response_format":{"type":"json_object"})", R"("user":7)", R"("best_of":0)",
        R"("best_of":2)", R"("suffix":3)", R"("suffix":"end")"}) {
    const std::string body = std::string(R"({"prompt":"a",)") + bad + "}";
    const std::pair<int, std::string> r = Refusal(body);
    EXPECT_EQ(r.first, 400) << body;
    const std::string name = Json::parse("{" + std::string(bad) + "}").begin().key();
    EXPECT_EQ(r.second, name) << body;
  }
  EXPECT_FALSE(Parse(R"({"prompt":"a","presence_penalty":0,"frequency_penalty":0.0,
                         "logit_bias":{},"tools":[],"tool_choice":"none","user":"u1",
                         "response_format":{"type":"text"},"best_of":1,"suffix":""})")
                   .error);
}

TEST_F(CompletionsApiTest, ContextLengthBoundsPromptAndMaxTokens) {
  const int limit = config_.max_position_embeddings;  // 512 for tiny
  Json ids = Json::array();
  for (int i = 0; i < limit; ++i) ids.push_back(65);
  EXPECT_EQ(Refusal(Json{{"prompt", ids}}.dump()).second, "prompt");
  ids.erase(ids.begin());  // limit - 1 tokens: one left
  ParsedCompletion fits = Parse(Json{{"prompt", ids}}.dump());
  ASSERT_FALSE(fits.error);
  EXPECT_EQ(fits.request.max_tokens, 1);  // the default is cut to the room left
  EXPECT_EQ(Refusal(Json{{"prompt", ids}, {"max_tokens", 2}}.dump()).second, "max_tokens");
  EXPECT_EQ(Parse(Json{{"prompt", "x"}, {"max_tokens", limit - 2}}.dump()).request.max_tokens,
            limit - 2);
}

TEST_F(CompletionsApiTest, StopStringsAreParsed) {
  EXPECT_EQ(Parse(R"({"prompt":"a","stop":"\n"})").request.stop, (std::vector<std::string>{"\n"}));
  EXPECT_EQ(Parse(R"({"prompt":"a","stop":["x","yz"]})").request.stop,
            (std::vector<std::string>{"x", "yz"}));
  EXPECT_TRUE(Parse(R"({"prompt":"a","stream":true,"stream_options":{"include_usage":true}})")
                  .request.include_usage);
}

// vLLM's extensions: min_tokens, ignore_eos and stop_token_ids are read; top_k, min_p and
// repetition_penalty are refused unless they change nothing, never ignored.
TEST_F(CompletionsApiTest, VllmSamplingExtensions) {
  ParsedCompletion p = Parse(
      R"({"prompt":"a","max_tokens":9,"min_tokens":4,"ignore_eos":true,"stop_token_ids":[65,7],
          "top_k":-1,"min_p":0,"repetition_penalty":1})");
  ASSERT_FALSE(p.error) << p.error->message;
  EXPECT_EQ(p.request.min_tokens, 4);
  EXPECT_TRUE(p.request.ignore_eos);
  EXPECT_EQ(p.request.stop_token_ids, (std::vector<int32_t>{65, 7}));
  EXPECT_FALSE(Parse(R"({"prompt":"a","top_k":0,"min_tokens":16})").error);
  EXPECT_FALSE(
      Parse(R"({"prompt":"a","top_k":null,"min_p":null,"repetition_penalty":null})").error);
  for (const char* bad :
       {R"("min_tokens":-1)", R"("min_tokens":17)", R"("min_tokens":"3")", R"("ignore_eos":1)",
        R"("stop_token_ids":7)", R"("stop_token_ids":[-1])", R"("stop_token_ids":[999])",
        R"("stop_token_ids":[4294967296])", R"("stop_token_ids":["a"])", R"("top_k":40)",
        R"("top_k":1.5)", R"("min_p":0.1)", R"("min_p":1e-50)", R"("min_p":2)",
        R"("repetition_penalty":1.1)", R"("repetition_penalty":1.00000001)",
        R"("repetition_penalty":0)"}) {
    const std::string body = std::string(R"({"prompt":"a",)") + bad + "}";
    const std::pair<int, std::string> r = Refusal(body);
    EXPECT_EQ(r.first, 400) << body;
    EXPECT_EQ(r.second, Json::parse("{" + std::string(bad) + "}").begin().key()) << body;
  }
  Json many = Json::array();
  for (int i = 0; i <= static_cast<int>(kMaxStopTokenIds); ++i) many.push_back(65);
  EXPECT_EQ(Refusal(Json{{"prompt", "a"}, {"stop_token_ids", many}}.dump()).second,
            "stop_token_ids");
}

std::string Feed(CompletionText* text, const std::string& bytes) {
  std::string out;
  for (char c : bytes) out += text->Append(std::string(1, c));
  return out + text->Finish();
}

TEST(CompletionTextTest, HoldsBackSplitUtf8Sequences) {
  CompletionText text;
  EXPECT_EQ(text.Append("a"), "a");
  EXPECT_EQ(text.Append("\xE2"), "");
  EXPECT_EQ(text.Append("\x82"), "");
  EXPECT_EQ(text.Append("\xAC"), "\xE2\x82\xAC");  // the euro sign, whole
  EXPECT_EQ(text.Finish(), "");
  EXPECT_EQ(text.text(), "a\xE2\x82\xAC");
}

TEST(CompletionTextTest, InvalidBytesBecomeReplacementCharacters) {
  const std::string bytes = "x\xFF\xE2\x82y\xC3\xA9\xF0\x9F\x98";  // bad, truncated, é, cut
  CompletionText text;
  const std::string joined = Feed(&text, bytes);
  EXPECT_EQ(joined, LenientUtf8(bytes));
  EXPECT_EQ(joined,
            "x\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBDy\xC3\xA9\xEF\xBF\xBD\xEF\xBF\xBD"
            "\xEF\xBF\xBD");
  EXPECT_EQ(LenientUtf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  EXPECT_EQ(LenientUtf8("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");                  // overlong
}

TEST(CompletionTextTest, PiecesJoinedEqualTheWholeForEveryByteSplit) {
  std::string bytes;
  for (int i = 0; i < 400; ++i) bytes += static_cast<char>((i * 97 + 13) % 256);
  CompletionText text;
  EXPECT_EQ(Feed(&text, bytes), LenientUtf8(bytes));
}

TEST(CompletionTextTest, StopStringEndsTheTextBeforeIt) {
  CompletionText text({"END", "\n\n"});
  EXPECT_EQ(text.Append("ab"), "ab");
  EXPECT_EQ(text.Append("E"), "");  // may begin "END"
  EXPECT_EQ(text.Append("x"), "Ex");
  EXPECT_EQ(text.Append("EN"), "");
  EXPECT_FALSE(text.stopped());
  EXPECT_EQ(text.Append("D tail"), "");
  EXPECT_TRUE(text.stopped());
  EXPECT_EQ(text.text(), "abEx");
  EXPECT_EQ(text.Append("more"), "");
}

TEST(CompletionTextTest, HeldBackStopPrefixIsReleasedAtTheEnd) {
  CompletionText text({"STOP"});
  EXPECT_EQ(text.Append("aST"), "a");
  EXPECT_EQ(text.Finish(), "ST");
  EXPECT_FALSE(text.stopped());
  EXPECT_EQ(text.text(), "aST");
}

// Text appended without a stop check (under min_tokens, or resumed on a replay) never stops
// the request, but a stop string that the next tokens complete is still found.
TEST(CompletionTextTest, UnstoppableTextIsNotSearchedButItsTailIs) {
  CompletionText text({"ab", "zz"});
  EXPECT_EQ(text.AppendUnstoppable("xzz"), "xz");  // the last z may begin "zz"
  EXPECT_FALSE(text.stopped());
  EXPECT_EQ(text.AppendUnstoppable("ab"), "zab");
  EXPECT_EQ(text.AppendUnstoppable("a"), "");  // may begin "ab": held back
  EXPECT_EQ(text.Append("b"), "");
  EXPECT_TRUE(text.stopped());
  EXPECT_EQ(text.text(), "xzzab");

  // A short stop string inside a longer one's held-back start, all under min_tokens: the
  // match must end in text looked at for stops.
  CompletionText nested({"b", "abc"});
  EXPECT_EQ(nested.AppendUnstoppable("xab"), "x");
  EXPECT_EQ(nested.Append("z"), "abz");
  EXPECT_FALSE(nested.stopped());
  CompletionText after({"b", "abc"});
  EXPECT_EQ(after.AppendUnstoppable("xa"), "x");
  EXPECT_EQ(after.Append("b"), "a");
  EXPECT_TRUE(after.stopped());
}

TEST(CompletionJsonTest, ResponseCarriesTokenIdsAndUsage) {
  CompletionHeader header{"cmpl-1", 1700000000, "tiny", 42};
  Json body = Json::parse(CompletionBody(header, "hi", "length", {104, 105}, {256, 1}, {2, 2}));
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["seed"], 42);
  EXPECT_EQ(body["choices"][0]["text"], "hi");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(body["choices"][0]["token_ids"], Json::array({104, 105}));
  EXPECT_EQ(body["choices"][0]["prompt_token_ids"], Json::array({256, 1}));
  EXPECT_EQ(body["usage"]["total_tokens"], 4);
  Json chunk = Json::parse(CompletionChunk(header, "h", "", {104}, nullptr));
  EXPECT_TRUE(chunk["choices"][0]["finish_reason"].is_null());
  EXPECT_FALSE(chunk["choices"][0].contains("prompt_token_ids"));
  Json usage = Json::parse(UsageChunk(header, {2, 2}));
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(SseEvent("{}"), "data: {}\n\n");
  EXPECT_EQ(SseDone(), "data: [DONE]\n\n");
}

TEST(ApiErrorTest, OpenAiShape) {
  Json e = Json::parse(ErrorBody(MakeApiError(400, "bad 'x'", "x")));
  EXPECT_EQ(e["error"]["message"], "bad 'x'");
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  EXPECT_EQ(e["error"]["param"], "x");
  EXPECT_TRUE(e["error"]["code"].is_null());
  EXPECT_EQ(ApiErrorFromStatus(ResourceExhausted("full")).http_status, 429);
  EXPECT_EQ(ApiErrorFromStatus(ResourceExhausted("full")).type, "rate_limit_error");
  EXPECT_EQ(ApiErrorFromStatus(Unavailable("down")).http_status, 503);
  EXPECT_EQ(ApiErrorFromStatus(Internal("bug")).http_status, 500);
  EXPECT_EQ(ApiErrorFromStatus(Internal("bug")).type, "server_error");
}

}  // namespace
}  // namespace baton
