// SseSplitter and StreamReplay as pure functions: events cut at every byte offset, the
// bodies of whole retries and replays (chat streams continued on /v1/completions), the
// rewrite of replayed events, and the cases that cannot be continued.
#include "router/stream/stream_replay.h"

#include <gtest/gtest.h>

#include "router/stream/sse_splitter.h"

namespace baton {
namespace {

using Json = nlohmann::ordered_json;

TEST(SseSplitterTest, WholeEventsAtEveryCut) {
  const std::string stream = "data: a\n\ndata: b\r\n\r\n: keep-alive\n\ndata: x\ndata: y\n\n";
  for (size_t cut = 0; cut <= stream.size(); ++cut) {
    SseSplitter s;
    std::vector<std::string> events;
    s.Feed(std::string_view(stream).substr(0, cut), &events);
    s.Feed(std::string_view(stream).substr(cut), &events);
    ASSERT_EQ(events.size(), 4u) << "cut " << cut;
    EXPECT_EQ(s.pending(), 0u);
    EXPECT_EQ(EventData(events[0]), "a");
    EXPECT_EQ(EventData(events[1]), "b");
    EXPECT_EQ(EventData(events[2]), std::nullopt);
    EXPECT_EQ(EventData(events[3]), "x\ny");
  }
}

TEST(SseSplitterTest, KeepsAPartialEvent) {
  SseSplitter s;
  std::vector<std::string> events;
  s.Feed("data: {\"half", &events);
  EXPECT_TRUE(events.empty());
  EXPECT_EQ(s.pending(), 12u);
}

std::string Chunk(const std::string& id, std::vector<int32_t> ids, const std::string& text,
                  const char* finish = nullptr, const std::vector<int32_t>* prompt = nullptr) {
  Json c;
  c["index"] = 0;
  c["text"] = text;
  c["finish_reason"] = finish == nullptr ? Json(nullptr) : Json(finish);
  c["token_ids"] = ids;
  if (prompt != nullptr) c["prompt_token_ids"] = *prompt;
  Json j;
  j["id"] = id;
  j["object"] = "text_completion";
  j["created"] = id == "first" ? 100 : 200;
  j["model"] = "m";
  j["seed"] = 9;
  j["choices"] = Json::array({c});
  return "data: " + j.dump() + "\n\n";
}

Json DataOf(const std::string& event) { return Json::parse(*EventData(event)); }

TEST(StreamReplayTest, FirstAttemptPassesThroughAndAddsReturnTokenIds) {
  StreamReplay r("/v1/completions", R"({"prompt":"hi","stream":true,"max_tokens":5})");
  r.BeginAttempt();
  Json body = Json::parse(r.AttemptBody());
  EXPECT_EQ(body["return_token_ids"], true);
  EXPECT_EQ(body["prompt"], "hi");
  // A client's resume count would make the engine take prompt tokens as generated ones.
  StreamReplay claimed("/v1/completions",
                       R"({"prompt":"hi","baton_resume_tokens":3,"return_token_ids":false})");
  claimed.BeginAttempt();
  const Json claimed_body = Json::parse(claimed.AttemptBody());
  EXPECT_FALSE(claimed_body.contains("baton_resume_tokens"));
  EXPECT_EQ(claimed_body["return_token_ids"], true) << "the ids are what a replay is made of";
  const std::vector<int32_t> prompt = {104, 105};
  const std::string e = Chunk("first", {7}, "a", nullptr, &prompt);
  StreamReplay::Outcome o = r.OnEvent(e);
  EXPECT_EQ(o.to_client, e);  // byte for byte
  EXPECT_TRUE(o.first_token);
  EXPECT_EQ(r.sent_ids(), (std::vector<int32_t>{7}));
}

TEST(StreamReplayTest, ReplayBodyAndRewrittenEvents) {
  StreamReplay r("/v1/completions",
                 R"({"prompt":"hi","stream":true,"max_tokens":5,
                     "stream_options":{"include_usage":true}})");
  r.BeginAttempt();
  const std::vector<int32_t> prompt = {104, 105};
  r.OnEvent(Chunk("first", {7}, "a", nullptr, &prompt));
  r.OnEvent(Chunk("first", {8}, "b"));
  ASSERT_TRUE(r.CanContinue());
  r.BeginAttempt();
  Json body = Json::parse(r.AttemptBody());
  EXPECT_EQ(body["prompt"], Json::array({104, 105, 7, 8}));
  EXPECT_EQ(body["max_tokens"], 3);
  EXPECT_EQ(body["seed"], 9);  // learned from the stream: the client gave none
  EXPECT_EQ(body["baton_resume_tokens"], 2);
  const std::vector<int32_t> longer = {104, 105, 7, 8};
  Json e = DataOf(r.OnEvent(Chunk("second", {9}, "c", nullptr, &longer)).to_client);
  EXPECT_EQ(e["id"], "first");
  EXPECT_EQ(e["created"], 100);
  EXPECT_FALSE(e["choices"][0].contains("prompt_token_ids"));
  EXPECT_EQ(e["choices"][0]["token_ids"], Json::array({9}));
  Json usage;
  usage["id"] = "second";
  usage["choices"] = Json::array();
  usage["usage"] = {{"prompt_tokens", 4}, {"completion_tokens", 1}, {"total_tokens", 5}};
  Json u = DataOf(r.OnEvent("data: " + usage.dump() + "\n\n").to_client);
  EXPECT_EQ(u["usage"]["prompt_tokens"], 2);
  EXPECT_EQ(u["usage"]["completion_tokens"], 3);
  EXPECT_EQ(u["usage"]["total_tokens"], 5);
  EXPECT_TRUE(r.OnEvent("data: [DONE]\n\n").done);
}

TEST(StreamReplayTest, ServerErrorEventFailsTheAttempt) {
  StreamReplay r("/v1/completions", R"({"prompt":[1,2],"stream":true,"seed":3})");
  r.BeginAttempt();
  StreamReplay::Outcome o =
      r.OnEvent(R"(data: {"error":{"message":"fenced","type":"server_error"}})"
                "\n\n");
  EXPECT_TRUE(o.engine_failed);
  EXPECT_TRUE(o.to_client.empty());
  EXPECT_FALSE(r.sent_anything());
  EXPECT_TRUE(r.CanContinue());
}

TEST(StreamReplayTest, WhatCannotBeContinued) {
  // No token ids in the events.
  StreamReplay no_ids("/v1/completions", R"({"prompt":"x","stream":true,"seed":1})");
  no_ids.BeginAttempt();
  no_ids.OnEvent(R"(data: {"id":"a","choices":[{"text":"t","finish_reason":null}]})"
                 "\n\n");
  EXPECT_FALSE(no_ids.CanContinue());
  // Chat without token ids: replayed whole only while nothing was sent.
  StreamReplay chat("/v1/chat/completions", R"({"messages":[],"stream":true})");
  chat.BeginAttempt();
  EXPECT_TRUE(chat.CanContinue());
  chat.OnEvent(R"(data: {"id":"a","choices":[{"delta":{"content":"t"}}]})"
               "\n\n");
  EXPECT_FALSE(chat.CanContinue());
  std::string end = chat.EndingEvents("gone");
  EXPECT_NE(end.find("\"engine_failed\""), std::string::npos);
  EXPECT_NE(end.find("data: [DONE]"), std::string::npos);
  // n > 1 interleaves choices.
  StreamReplay n2("/v1/completions", R"({"prompt":"x","stream":true,"seed":1,"n":2})");
  n2.BeginAttempt();
  n2.OnEvent(Chunk("first", {1}, "a"));
  EXPECT_FALSE(n2.CanContinue());
}

// min_tokens counts the tokens already sent; answers whose shape a continuation cannot keep
// (structured output, prompt log probabilities, a suffix) are ended explicitly instead.
TEST(StreamReplayTest, MinTokensShrinksAndStructuredOutputIsNotContinued) {
  StreamReplay r("/v1/completions",
                 R"({"prompt":"hi","stream":true,"seed":1,"max_tokens":64,"min_tokens":3})");
  r.BeginAttempt();
  const std::vector<int32_t> prompt = {104, 105};
  r.OnEvent(Chunk("first", {7}, "a", nullptr, &prompt));
  r.OnEvent(Chunk("first", {8}, "b"));
  ASSERT_TRUE(r.CanContinue());
  r.BeginAttempt();
  Json body = Json::parse(r.AttemptBody());
  EXPECT_EQ(body["min_tokens"], 1);
  r.OnEvent(Chunk("second", {9}, "c"));
  r.OnEvent(Chunk("second", {10}, "d"));
  r.BeginAttempt();
  EXPECT_EQ(Json::parse(r.AttemptBody())["min_tokens"], 0) << "never below zero";
  for (const char* extra : {R"("guided_json":{"type":"object"})", R"("guided_regex":"a+")",
                            R"("response_format":{"type":"json_object"})", R"("prompt_logprobs":1)",
                            R"("suffix":"end")"}) {
    StreamReplay s("/v1/completions",
                   std::string(R"({"prompt":"hi","stream":true,"seed":1,)") + extra + "}");
    s.BeginAttempt();
    EXPECT_TRUE(s.CanContinue()) << extra << ": a whole retry while nothing was sent";
    s.OnEvent(Chunk("first", {7}, "a", nullptr, &prompt));
    EXPECT_FALSE(s.CanContinue()) << extra;
  }
}

TEST(StreamReplayTest, OnlyOneSequenceIsContinued) {
  for (const char* body : {R"({"prompt":["a","b"],"stream":true,"seed":1})",
                           R"({"prompt":[[1],[2]],"stream":true,"seed":1})",
                           R"({"prompt":"a","stream":true,"seed":1,"echo":true})",
                           R"({"prompt":"a","stream":true,"seed":1,"best_of":2})"}) {
    StreamReplay r("/v1/completions", body);
    r.BeginAttempt();
    const std::vector<int32_t> prompt = {1};
    r.OnEvent(Chunk("first", {1}, "a", "stop", &prompt));
    EXPECT_FALSE(r.finished()) << body;  // the other sequences may still be running
    EXPECT_FALSE(r.CanContinue()) << body;
  }
  StreamReplay one("/v1/completions", R"({"prompt":[1,2],"stream":true,"seed":1,"n":1})");
  one.BeginAttempt();
  one.OnEvent(Chunk("first", {1}, "a"));
  EXPECT_TRUE(one.CanContinue());
}

TEST(StreamReplayTest, HostileEngineEventsAreNotFatal) {
  StreamReplay r("/v1/completions", R"({"prompt":[1,2],"stream":true,"seed":3})");
  r.BeginAttempt();
  for (const char* e :
       {R"(data: {"error":{"message":"x","type":null}})",
        R"(data: {"error":{"message":"x","type":1}})", R"(data: {"error":"flat"})"}) {
    StreamReplay::Outcome o = r.OnEvent(std::string(e) + "\n\n");
    EXPECT_FALSE(o.engine_failed) << e;
    EXPECT_EQ(o.to_client, std::string(e) + "\n\n");
  }
  const std::string deep = "data: " + std::string(100000, '[') + std::string(100000, ']');
  EXPECT_EQ(r.OnEvent(deep + "\n\n").to_client, deep + "\n\n");
  // Engine text with a character cut in half is printed with a replacement character.
  const std::string end = r.EndingEvents(std::string(199, 'a') + "\xc3");
  EXPECT_TRUE(Json::accept(*EventData(end.substr(0, end.find("\n\n") + 2))));
}

TEST(StreamReplayTest, DeeplyNestedBodyIsNotParsed) {
  const std::string deep =
      R"({"prompt":"hi","x":)" + std::string(50000, '[') + std::string(50000, ']') + "}";
  StreamReplay r("/v1/completions", deep);
  r.BeginAttempt();
  EXPECT_EQ(r.AttemptBody(), deep);
}

TEST(StreamReplayTest, FinishedStreamOnlyNeedsItsTail) {
  StreamReplay r("/v1/completions",
                 R"({"prompt":[1],"stream":true,"max_tokens":1,
                     "stream_options":{"include_usage":true}})");
  r.BeginAttempt();
  r.OnEvent(Chunk("first", {5}, "z", "length"));
  EXPECT_TRUE(r.finished());
  const std::string tail = r.FinishingEvents();
  Json usage = DataOf(tail.substr(0, tail.find("\n\n") + 2));
  EXPECT_EQ(usage["id"], "first");
  EXPECT_EQ(usage["usage"]["completion_tokens"], 1);
  EXPECT_NE(tail.find("data: [DONE]\n\n"), std::string::npos);
  // Cut after the usage event: only [DONE] is missing.
  Json usage_event;
  usage_event["id"] = "first";
  usage_event["choices"] = Json::array();
  usage_event["usage"] = {{"prompt_tokens", 1}, {"completion_tokens", 1}, {"total_tokens", 2}};
  r.OnEvent("data: " + usage_event.dump() + "\n\n");
  EXPECT_EQ(r.FinishingEvents(), "data: [DONE]\n\n");
}

// StreamReplay leaves a body it cannot read as it is; the router refuses such a generating
// request before any attempt (body_read(), RouterInputTest).
TEST(StreamReplayTest, NonJsonBodyIsForwardedUnchanged) {
  StreamReplay r("/v1/completions", "not json");
  EXPECT_TRUE(r.generates());
  EXPECT_FALSE(r.body_read());
  r.BeginAttempt();
  EXPECT_EQ(r.AttemptBody(), "not json");
  EXPECT_FALSE(StreamReplay("/v1/completions", R"({"prompt":"x","temperature":NaN})").body_read());
  EXPECT_FALSE(StreamReplay("/v1/completions", "[1]").body_read());
  EXPECT_TRUE(StreamReplay("/v1/completions", R"({"prompt":"x"})").body_read());
  EXPECT_FALSE(StreamReplay("/v1/models", "").generates());
}

std::string ChatEvent(std::vector<int32_t> ids, const std::string& content,
                      const std::vector<int32_t>* prompt = nullptr) {
  Json c;
  c["index"] = 0;
  c["delta"] = prompt != nullptr ? Json{{"role", "assistant"}, {"content", content}}
                                 : Json{{"content", content}};
  c["finish_reason"] = nullptr;
  c["token_ids"] = ids;
  Json j;
  j["id"] = "chatcmpl-first";
  j["object"] = "chat.completion.chunk";
  j["created"] = 100;
  j["model"] = "m";
  j["seed"] = 9;
  j["choices"] = Json::array({c});
  if (prompt != nullptr) j["prompt_token_ids"] = *prompt;
  return "data: " + j.dump() + "\n\n";
}

// A chat stream whose engine failed after its first chunk (the role, no token) is retried
// whole on chat: the client does not get the role chunk twice, and the retry's events carry
// the first attempt's id and created.
TEST(StreamReplayChatTest, AWholeRetryAfterTheRoleChunkSendsItOnceUnderOneId) {
  StreamReplay r("/v1/chat/completions",
                 R"({"messages":[{"role":"user","content":"hi"}],"stream":true,"seed":9})");
  r.BeginAttempt();
  const std::vector<int32_t> prompt = {256, 1, 2};
  const std::string role = ChatEvent({}, "", &prompt);
  EXPECT_EQ(r.OnEvent(role).to_client, role);
  ASSERT_TRUE(r.CanContinue());

  r.BeginAttempt();
  EXPECT_EQ(r.AttemptTarget("/v1/chat/completions"), "/v1/chat/completions") << "whole";
  EXPECT_FALSE(Json::parse(r.AttemptBody()).contains("baton_resume_tokens"));
  std::string again = role;
  again.replace(again.find("chatcmpl-first"), 14, "chatcmpl-later");
  again.replace(again.find("\"created\":100"), 13, "\"created\":200");
  EXPECT_EQ(r.OnEvent(again).to_client, "") << "the role chunk was sent already";
  std::string token = ChatEvent({7}, "a");
  token.replace(token.find("chatcmpl-first"), 14, "chatcmpl-later");
  token.replace(token.find("\"created\":100"), 13, "\"created\":200");
  token.insert(token.find("\"choices\""), "\"prompt_token_ids\":[256,1,2],");
  const Json chunk = DataOf(r.OnEvent(token).to_client);
  EXPECT_FALSE(chunk.contains("prompt_token_ids")) << "sent with the role chunk already";
  EXPECT_EQ(chunk["id"], "chatcmpl-first");
  EXPECT_EQ(chunk["created"], 100);
  EXPECT_EQ(chunk["choices"][0]["delta"]["content"], "a") << "a chat chunk stays one";
  EXPECT_EQ(chunk["choices"][0]["token_ids"], Json({7}));
}

TEST(StreamReplayChatTest, AChatStreamContinuesOnCompletionsAsChatChunks) {
  StreamReplay r("/v1/chat/completions",
                 R"({"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,
                     "temperature":0.5,"stop":["\n"],"max_completion_tokens":10,
                     "stream_options":{"include_usage":true}})");
  r.BeginAttempt();
  EXPECT_EQ(r.AttemptTarget("/v1/chat/completions"), "/v1/chat/completions");
  EXPECT_EQ(Json::parse(r.AttemptBody())["return_token_ids"], true);
  const std::vector<int32_t> prompt = {256, 1, 2};
  const std::string first = ChatEvent({7}, "a", &prompt);
  EXPECT_EQ(r.OnEvent(first).to_client, first);  // the first attempt passes through
  r.OnEvent(ChatEvent({8}, "b"));
  ASSERT_TRUE(r.CanContinue());

  r.BeginAttempt();
  EXPECT_EQ(r.AttemptTarget("/v1/chat/completions"), "/v1/completions");
  Json body = Json::parse(r.AttemptBody());
  EXPECT_EQ(body["prompt"], Json({256, 1, 2, 7, 8}));
  EXPECT_EQ(body["max_tokens"], 8);
  EXPECT_EQ(body["seed"], 9);
  EXPECT_EQ(body["baton_resume_tokens"], 2);
  EXPECT_EQ(body["temperature"], 0.5);
  EXPECT_EQ(body["stop"], Json::array({"\n"}));
  EXPECT_EQ(body["model"], "m");
  EXPECT_EQ(body["stream"], true);
  EXPECT_FALSE(body.contains("messages"));
  EXPECT_FALSE(body.contains("max_completion_tokens"));

  // The continuation's completions events reach the client as chat chunks of the first id.
  StreamReplay::Outcome o = r.OnEvent(Chunk("second", {9}, "c", "length"));
  Json chunk = DataOf(o.to_client);
  EXPECT_EQ(chunk["id"], "chatcmpl-first");
  EXPECT_EQ(chunk["object"], "chat.completion.chunk");
  EXPECT_EQ(chunk["created"], 100);
  EXPECT_EQ(chunk["choices"][0]["delta"], (Json{{"content", "c"}}));
  EXPECT_EQ(chunk["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(chunk["choices"][0]["token_ids"], Json({9}));
  EXPECT_FALSE(chunk["choices"][0].contains("text"));
  EXPECT_EQ(r.sent_ids(), (std::vector<int32_t>{7, 8, 9}));
  Json usage = DataOf(r.FinishingEvents().substr(0, r.FinishingEvents().find("\n\n") + 2));
  EXPECT_EQ(usage["object"], "chat.completion.chunk");
  EXPECT_EQ(usage["usage"]["prompt_tokens"], 3);
  EXPECT_EQ(usage["usage"]["completion_tokens"], 3);
}

// vLLM's first chat chunk has only the role: no token ids, no content. It carries no token,
// so the stream stays continuable; the prompt's ids come only from the engine. A stray
// `prompt` in a chat body is no chat field: that stream is not continued at all.
TEST(StreamReplayChatTest, AFirstChunkWithOnlyTheRoleKeepsTheStreamContinuable) {
  StreamReplay r("/v1/chat/completions", R"({"messages":[],"stream":true,"seed":3})");
  r.BeginAttempt();
  r.OnEvent(R"(data: {"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":""},)"
            R"("logprobs":null,"finish_reason":null}],"prompt_token_ids":[256,1]})"
            "\n\n");
  r.OnEvent(ChatEvent({7}, "a"));
  ASSERT_TRUE(r.CanContinue());
  r.BeginAttempt();
  EXPECT_EQ(Json::parse(r.AttemptBody())["prompt"], Json({256, 1, 7}));

  StreamReplay stray("/v1/chat/completions",
                     R"({"messages":[],"stream":true,"seed":3,"prompt":[5,5,5]})");
  stray.BeginAttempt();
  const std::vector<int32_t> prompt = {256};
  stray.OnEvent(ChatEvent({7}, "a", &prompt));
  EXPECT_FALSE(stray.CanContinue());
}

TEST(StreamReplayChatTest, WithoutALimitTheContinuationSetsNone) {
  StreamReplay r("/v1/chat/completions", R"({"messages":[],"stream":true,"seed":3})");
  r.BeginAttempt();
  const std::vector<int32_t> prompt = {256};
  r.OnEvent(ChatEvent({7}, "a", &prompt));
  ASSERT_TRUE(r.CanContinue());
  r.BeginAttempt();
  Json body = Json::parse(r.AttemptBody());
  EXPECT_FALSE(body.contains("max_tokens"));
  EXPECT_EQ(body["seed"], 3);
}

TEST(StreamReplayChatTest, AnswersThatAreNotPlainTextAreNotContinued) {
  for (const char* extra :
       {R"("tools":[{"type":"function"}])", R"("response_format":{"type":"json_object"})",
        R"("logprobs":true)", R"("n":2)", R"("guided_json":{"type":"object"})",
        R"("top_logprobs":2)", R"("some_new_field":1)"}) {
    StreamReplay r("/v1/chat/completions",
                   std::string(R"({"messages":[],"stream":true,"seed":3,)") + extra + "}");
    r.BeginAttempt();
    const std::vector<int32_t> prompt = {256};
    r.OnEvent(ChatEvent({7}, "a", &prompt));
    EXPECT_FALSE(r.CanContinue()) << extra;
  }
  // A delta of reasoning or tool calls is not answer text.
  for (const char* delta : {R"({"reasoning_content":"hmm"})", R"({"tool_calls":[{"id":"t"}]})"}) {
    StreamReplay r("/v1/chat/completions", R"({"messages":[],"stream":true,"seed":3})");
    r.BeginAttempt();
    const std::vector<int32_t> prompt = {256};
    r.OnEvent(ChatEvent({7}, "a", &prompt));
    r.OnEvent(std::string(R"(data: {"choices":[{"index":0,"delta":)") + delta +
              R"(,"token_ids":[8],"finish_reason":null}]})"
              "\n\n");
    EXPECT_FALSE(r.CanContinue()) << delta;
  }
  // Inert fields and null or false ones do not stop a continuation.
  StreamReplay inert("/v1/chat/completions",
                     R"({"messages":[],"stream":true,"seed":3,"user":"u","tools":null,
                         "logprobs":false,"n":1,"max_tokens":9})");
  inert.BeginAttempt();
  const std::vector<int32_t> prompt = {256};
  inert.OnEvent(ChatEvent({7}, "a", &prompt));
  EXPECT_TRUE(inert.CanContinue());
  StreamReplay no_ids("/v1/chat/completions", R"({"messages":[],"stream":true,"seed":3})");
  no_ids.BeginAttempt();
  no_ids.OnEvent(R"(data: {"choices":[{"delta":{"content":"a"}}]})"
                 "\n\n");
  EXPECT_FALSE(no_ids.CanContinue()) << "an engine that sends no token ids";
}

TEST(StreamReplayChatTest, MinTokensShrinksOnAChatContinuation) {
  StreamReplay chat("/v1/chat/completions",
                    R"({"messages":[],"stream":true,"seed":1,"min_tokens":5})");
  chat.BeginAttempt();
  const std::vector<int32_t> chat_prompt = {256};
  chat.OnEvent(ChatEvent({7}, "a", &chat_prompt));
  chat.OnEvent(ChatEvent({8}, "b"));
  ASSERT_TRUE(chat.CanContinue()) << "min_tokens alone keeps a chat continuable";
  chat.BeginAttempt();
  EXPECT_EQ(Json::parse(chat.AttemptBody())["min_tokens"], 3);
}

// Every attempt carries the router's key, the same one; a key in the client's body is
// replaced (or dropped when the router gives none): clients never choose keys.
TEST(StreamReplayKeyTest, EveryAttemptCarriesTheRouterKeyNotTheClients) {
  const std::string key(32, 'a');
  StreamReplay r("/v1/completions",
                 R"({"prompt":"hi","stream":true,"max_tokens":5,
                     "baton_request_key":"00000000000000000000000000000000"})",
                 key);
  r.BeginAttempt();
  EXPECT_EQ(Json::parse(r.AttemptBody())["baton_request_key"], key);
  const std::vector<int32_t> prompt = {104, 105};
  EXPECT_TRUE(r.OnEvent(Chunk("first", {7}, "a", nullptr, &prompt)).new_tokens);
  ASSERT_TRUE(r.CanContinue());
  r.BeginAttempt();
  Json replay = Json::parse(r.AttemptBody());
  EXPECT_EQ(replay["baton_resume_tokens"], 1);
  EXPECT_EQ(replay["baton_request_key"], key);
  StreamReplay keyless("/v1/completions", R"({"prompt":"hi","baton_request_key":"x"})");
  keyless.BeginAttempt();
  EXPECT_FALSE(Json::parse(keyless.AttemptBody()).contains("baton_request_key"));
}

// A chat stream continued on /v1/completions keeps its key; a key in the chat body does not
// stop the continuation (it is replaced, not carried).
TEST(StreamReplayKeyTest, AChatContinuationCarriesTheSameKey) {
  const std::string key(32, 'b');
  StreamReplay r("/v1/chat/completions",
                 R"({"messages":[],"stream":true,"seed":3,"baton_request_key":"mine"})", key);
  r.BeginAttempt();
  EXPECT_EQ(Json::parse(r.AttemptBody())["baton_request_key"], key);
  const std::vector<int32_t> prompt = {256};
  r.OnEvent(ChatEvent({7}, "a", &prompt));
  ASSERT_TRUE(r.CanContinue());
  r.BeginAttempt();
  ASSERT_EQ(r.AttemptTarget("/v1/chat/completions"), "/v1/completions");
  EXPECT_EQ(Json::parse(r.AttemptBody())["baton_request_key"], key);
}

TEST(StreamReplayKeyTest, NewTokensOnlyForEventsWithIdsNotSentBefore) {
  StreamReplay r("/v1/completions", R"({"prompt":[1],"stream":true,"seed":3})", "k");
  r.BeginAttempt();
  EXPECT_TRUE(r.OnEvent(Chunk("first", {5}, "a")).new_tokens);
  EXPECT_FALSE(r.OnEvent(Chunk("first", {}, "")).new_tokens);
  EXPECT_FALSE(r.OnEvent("data: [DONE]\n\n").new_tokens);
}

}  // namespace
}  // namespace baton
