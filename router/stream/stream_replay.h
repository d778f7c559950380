// StreamReplay: what the router keeps of one client request so that it can be replayed on
// another engine without the client noticing (docs/architecture.md, Lossless requests).
//
// It holds the client's body and learns, from the engine's stream, the request's seed, its
// prompt as token ids and every token id sent to the client. AttemptBody() gives the body of
// the next attempt, each with the request's key as `baton_request_key` (the same on every
// attempt; one the client put in its body is replaced), by which an engine finds the KV cache
// a failed attempt left:
//   - nothing sent yet: the client's body (with `return_token_ids: true` added on
//     /v1/completions), a whole retry;
//   - tokens sent: a replay on token ids: `prompt` = prompt ids + ids sent, `max_tokens`
//     reduced by their number (16, OpenAI's default, when the client gave none), the same
//     `seed`, `min_tokens` reduced by their number, and `baton_resume_tokens` = their number,
//     so an engine that knows it continues the text exactly (held-back bytes of a split UTF-8
//     sequence or a possible stop string, and the ids that count as output for penalties).
//     A completions stream with structured output (guided_*, response_format,
//     structured_outputs), prompt_logprobs or a suffix is not continued.
// OnEvent() takes each whole SSE event of an attempt and says what goes to the client. On the
// first attempt events pass through byte for byte. On a replay each event is rewritten so the
// client's stream reads as one: the first attempt's `id` and `created`, no second
// `prompt_token_ids`, and `usage` counted over the whole request. An error event of type
// `server_error` (an engine failing) is not forwarded: the attempt failed and is replayed.
//
// A streamed request can be replayed once something was sent only with token ids in every
// event, on /v1/completions or on /v1/chat/completions. A chat stream is continued on
// /v1/completions (AttemptTarget()): prompt = the prompt's ids as the engine reported them
// (`prompt_token_ids`, the chat template applied) + the ids sent, the chat body's sampling
// fields, `max_tokens` = the client's `max_completion_tokens` (or `max_tokens`) less the ids
// sent, or none when it gave none; the continuation's completions events are rewritten as
// chat chunks (`delta.content`). Chat answers that are not plain text (tools, structured
// output, log probabilities) are not continued. Otherwise CanContinue() is false and the
// stream must end with an explicit error (EndingEvents()). Plain value; used on one
// request's strand.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace baton {

class StreamReplay {
 public:
  // `route` is the path ("/v1/completions", "/v1/chat/completions", ...); `request_key`
  // (NewRequestKey()) goes into every attempt's body, none when empty.
  StreamReplay(std::string route, const std::string& body, std::string request_key = "");

  bool streaming() const { return stream_; }
  // Whether the route generates (completions, chat), so that each attempt's body is the
  // router's rewrite of the client's.
  bool generates() const;
  // Whether the router read the body as a JSON object (RFC 8259: no NaN, Infinity or number out
  // of range; nested at most kMaxJsonDepth deep). A generating request whose body it did not
  // read is not forwarded: its engine would get the client's own request key and resume count.
  bool body_read() const { return body_.is_object(); }
  // The request's `model` ("" when it names none, or is not a JSON object).
  std::string model() const;
  // The body of the next attempt (see above). Call BeginAttempt() first.
  std::string AttemptBody() const;
  // The request target of the next attempt: the client's `target`, except for a chat stream
  // continued after tokens were sent, which goes to /v1/completions (see above).
  std::string AttemptTarget(const std::string& target) const;
  // Starts an attempt: a replay when tokens were already sent.
  void BeginAttempt();
  int attempts() const { return attempts_; }

  struct Outcome {
    std::string to_client;       // bytes for the client ("" for none)
    bool done = false;           // the stream's [DONE] was seen
    bool engine_failed = false;  // a server_error event: the attempt failed
    bool first_token = false;    // this event carried the request's first token
    bool new_tokens = false;     // this event carried token ids not sent before
  };
  Outcome OnEvent(const std::string& event);

  // Whether anything (an event) has been sent to the client.
  bool sent_anything() const { return events_sent_ > 0; }
  // Whether a failure now can be recovered: nothing sent (whole retry), or a replay on ids.
  bool CanContinue() const;
  // The generation already ended (a finish_reason was sent) but [DONE] was not seen: the
  // events that end the stream properly (usage when asked for, then [DONE]).
  bool finished() const { return finished_; }
  std::string FinishingEvents() const;
  // An explicit error event and [DONE], for a stream that cannot go on.
  std::string EndingEvents(const std::string& message) const;

  size_t tokens_sent() const { return sent_ids_.size(); }
  const std::vector<int32_t>& sent_ids() const { return sent_ids_; }
  // Whether sent_ids() is every token id sent: each event carried its ids, one sequence.
  bool ids_known() const { return ids_known_; }
  // Whether the client's body fixes its answer: an integer `seed`, or `temperature` 0
  // (greedy). Two engines of one model must then generate the same token ids.
  bool reproducible() const { return reproducible_; }

 private:
  bool replaying_chat() const;
  void Learn(const nlohmann::ordered_json& event);
  std::string Rewrite(nlohmann::ordered_json event) const;
  std::string ChatReplayBody() const;
  nlohmann::ordered_json ChatChunkOf(const nlohmann::ordered_json& event) const;
  nlohmann::ordered_json UsageJson() const;
  std::string Dump(nlohmann::ordered_json body) const;  // with the request key

  const std::string route_;
  const std::string raw_body_;
  const std::string request_key_;
  nlohmann::ordered_json body_;  // null when the body is not a JSON object
  bool stream_ = false;
  bool include_usage_ = false;
  std::optional<int64_t> max_tokens_;
  std::optional<uint64_t> seed_;
  std::optional<std::vector<int32_t>> prompt_ids_;
  std::vector<int32_t> sent_ids_;
  bool ids_known_ = true;  // every event sent carried its token ids
  bool single_ = true;     // one sequence: n = 1, best_of = 1, one prompt, no echo
  bool reproducible_ = false;
  bool finished_ = false;
  bool usage_sent_ = false;  // the stream's usage event reached the client
  int events_sent_ = 0;
  int attempts_ = 0;
  size_t resume_tokens_ = 0;  // tokens sent before the current attempt
  // The current attempt follows one that sent events: its events read as the first attempt's
  // (id, created), and one that carries no token (a chat stream's role chunk) is not sent again.
  bool resent_ = false;
  nlohmann::ordered_json id_, created_, model_;
};

}  // namespace baton
