#include "router/stream/stream_replay.h"

#include <algorithm>
#include <span>

#include "base/text/json_depth.h"
#include "router/stream/sse_splitter.h"

namespace baton {
namespace {

using Json = nlohmann::ordered_json;

constexpr int64_t kDefaultMaxTokens = 16;  // OpenAI's default for /v1/completions

bool IsCompletions(const std::string& route) { return route == "/v1/completions"; }
bool IsChat(const std::string& route) { return route == "/v1/chat/completions"; }

// Fields of a chat request that a continuation on /v1/completions carries over unchanged:
// sampling, as OpenAI and vLLM spell it on both routes.
constexpr const char* kCarriedSamplingFields[] = {"model",
                                                  "temperature",
                                                  "top_p",
                                                  "top_k",
                                                  "min_p",
                                                  "frequency_penalty",
                                                  "presence_penalty",
                                                  "repetition_penalty",
                                                  "stop",
                                                  "stop_token_ids",
                                                  "logit_bias",
                                                  "ignore_eos",
                                                  "stream",
                                                  "stream_options",
                                                  "skip_special_tokens"};

// Fields a continuation needs no copy of: the prompt and limit (rebuilt), the seed and the
// request key (set), bookkeeping that does not change what is generated.
constexpr const char* kRebuiltOrInertFields[] = {
    "messages", "max_tokens", "max_completion_tokens", "min_tokens",
    "seed",     "n",          "return_token_ids",      "user",
    "metadata", "store",      "service_tier",          "baton_request_key"};

// Fields of a completions request whose answer a continuation cannot give: structured output
// (the grammar would start again at the cut), prompt log probabilities (they would be sent a
// second time, for the longer prompt), a suffix (inserted after the continuation only).
constexpr const char* kNotContinuedCompletionFields[] = {
    "guided_json",     "guided_regex",       "guided_choice",   "guided_grammar",
    "response_format", "structured_outputs", "prompt_logprobs", "suffix"};

bool Listed(const std::string& key, std::span<const char* const> list) {
  return std::any_of(list.begin(), list.end(), [&](const char* k) { return key == k; });
}

// Whether a chat answer is plain text that a completion of the same ids, with the carried
// fields, continues exactly: every field of the body is carried, rebuilt or inert (or null /
// false). Anything else (tools, structured output such as response_format or guided_json,
// log probabilities, ...) would be dropped or answered differently, so such a
// stream is ended explicitly rather than continued wrongly.
bool PlainTextChat(const Json& body) {
  for (const auto& [key, value] : body.items()) {
    if (value.is_null() || value == false) continue;
    if (!Listed(key, kCarriedSamplingFields) && !Listed(key, kRebuiltOrInertFields)) return false;
  }
  return true;
}

// Whether a completions request's stream can be continued on token ids (see above).
bool ContinuableCompletion(const Json& body) {
  for (const auto& [key, value] : body.items()) {
    if (value.is_null() || value == false) continue;
    if (Listed(key, kNotContinuedCompletionFields)) return false;
  }
  return true;
}

// `min_tokens` less the tokens already sent (they count towards it), when the body has one.
void ReduceMinTokens(const Json& body, size_t sent, Json* out) {
  auto it = body.find("min_tokens");
  if (it == body.end() || !it->is_number_integer()) return;
  (*out)["min_tokens"] = std::max<int64_t>(0, it->get<int64_t>() - static_cast<int64_t>(sent));
}

// A chat delta that is not plain answer text: reasoning or tool calls.
bool OtherThanContent(const Json& choice) {
  auto delta = choice.find("delta");
  if (delta == choice.end() || !delta->is_object()) return false;
  for (const char* key : {"reasoning", "reasoning_content", "tool_calls", "function_call"}) {
    auto it = delta->find(key);
    if (it != delta->end() && !it->is_null() &&
        !(it->is_string() && it->get_ref<const std::string&>().empty()) &&
        !(it->is_array() && it->empty())) {
      return true;
    }
  }
  return false;
}

// A choice that carries no token: no ids, no text, not the last (vLLM's first chat chunk,
// which has only the role).
bool CarriesNoToken(const Json& choice) {
  auto finish = choice.find("finish_reason");
  if (finish != choice.end() && !finish->is_null()) return false;
  auto text = choice.find("text");
  if (text != choice.end() && !(text->is_string() && text->get_ref<const std::string&>().empty())) {
    return false;
  }
  auto delta = choice.find("delta");
  if (delta == choice.end() || !delta->is_object()) return text != choice.end();
  auto content = delta->find("content");
  return content == delta->end() || content->is_null() ||
         (content->is_string() && content->get_ref<const std::string&>().empty());
}

// An event whose choices all carry no token, neither text nor ids (a chat stream's first
// chunk, the role), and no usage.
bool NoTokenEvent(const Json& event) {
  auto choices = event.find("choices");
  if (choices == event.end() || !choices->is_array() || choices->empty()) return false;
  if (auto usage = event.find("usage"); usage != event.end() && !usage->is_null()) return false;
  return std::all_of(choices->begin(), choices->end(), [](const Json& c) {
    if (!c.is_object() || !CarriesNoToken(c)) return false;
    auto ids = c.find("token_ids");
    return ids == c.end() || ids->is_null() || (ids->is_array() && ids->empty());
  });
}

std::optional<uint64_t> SeedOf(const Json& j) {
  if (j.is_number_unsigned()) return j.get<uint64_t>();
  if (j.is_number_integer()) return static_cast<uint64_t>(j.get<int64_t>());
  return std::nullopt;
}

// A prompt given as token ids: [1, 2, 3] or [[1, 2, 3]].
std::optional<std::vector<int32_t>> PromptIds(const Json& prompt) {
  const Json* p = &prompt;
  if (p->is_array() && p->size() == 1 && (*p)[0].is_array()) p = &(*p)[0];
  if (!p->is_array() || p->empty()) return std::nullopt;
  std::vector<int32_t> ids;
  for (const Json& v : *p) {
    if (!v.is_number_integer()) return std::nullopt;
    ids.push_back(v.get<int32_t>());
  }
  return ids;
}

// Strings copied from engines may hold invalid UTF-8; they are replaced, never fatal.
// Whether the request asks for exactly one sequence, which is all a replay can continue.
bool SingleSequence(const Json& body) {
  for (const char* key : {"n", "best_of"}) {
    auto it = body.find(key);
    if (it != body.end() && !it->is_null() && !(it->is_number_integer() && *it == 1)) {
      return false;
    }
  }
  if (auto it = body.find("echo"); it != body.end() && *it != false && !it->is_null()) {
    return false;
  }
  auto prompt = body.find("prompt");
  if (prompt == body.end() || !prompt->is_array() || prompt->size() <= 1) return true;
  return !(*prompt)[0].is_string() && !(*prompt)[0].is_array();  // [ids] is one prompt
}

std::string Event(const Json& j) {
  return "data: " + j.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n\n";
}

// Parses `text` unless it nests deeper than kMaxJsonDepth (copying or printing such a value
// recurses once per level); a refused or malformed text is a discarded value.
Json ParseBounded(std::string_view text) {
  if (JsonNestingDepth(text) > kMaxJsonDepth) return Json(Json::value_t::discarded);
  return Json::parse(text, nullptr, /*allow_exceptions=*/false);
}

}  // namespace

StreamReplay::StreamReplay(std::string route, const std::string& body, std::string request_key)
    : route_(std::move(route)), raw_body_(body), request_key_(std::move(request_key)) {
  Json j = ParseBounded(body);
  if (!j.is_object()) return;
  body_ = std::move(j);
  if (auto it = body_.find("stream"); it != body_.end() && it->is_boolean()) stream_ = *it;
  if (auto it = body_.find("stream_options"); it != body_.end() && it->is_object()) {
    auto u = it->find("include_usage");
    include_usage_ = u != it->end() && u->is_boolean() && u->get<bool>();
  }
  for (const char* key : {"max_completion_tokens", "max_tokens"}) {
    if (!IsChat(route_) && std::string_view(key) != "max_tokens") continue;
    if (auto it = body_.find(key); it != body_.end() && it->is_number_integer()) {
      max_tokens_ = it->get<int64_t>();
      break;
    }
  }
  if (auto it = body_.find("seed"); it != body_.end()) seed_ = SeedOf(*it);
  auto temperature = body_.find("temperature");
  reproducible_ = seed_.has_value() || (temperature != body_.end() && temperature->is_number() &&
                                        temperature->get<double>() == 0);
  if (auto it = body_.find("prompt"); it != body_.end() && !IsChat(route_)) {
    prompt_ids_ = PromptIds(*it);
  }
  single_ = SingleSequence(body_) &&
            (IsChat(route_) ? PlainTextChat(body_) : ContinuableCompletion(body_));
  if (!single_) ids_known_ = false;  // choices interleave; a replay continues one sequence only
}

void StreamReplay::BeginAttempt() {
  ++attempts_;
  resume_tokens_ = sent_ids_.size();
  resent_ = events_sent_ > 0;
}

bool StreamReplay::generates() const { return IsCompletions(route_) || IsChat(route_); }

bool StreamReplay::replaying_chat() const {
  return IsChat(route_) && resume_tokens_ > 0 && body_.is_object();
}

std::string StreamReplay::AttemptTarget(const std::string& target) const {
  return replaying_chat() ? "/v1/completions" : target;
}

std::string StreamReplay::model() const {
  if (!body_.is_object()) return "";
  auto it = body_.find("model");
  return it != body_.end() && it->is_string() ? it->get<std::string>() : "";
}

std::string StreamReplay::AttemptBody() const {
  if (!body_.is_object()) return raw_body_;
  if (!IsCompletions(route_) && !IsChat(route_)) return raw_body_;
  Json j = body_;
  // Also over a client's false: without the ids a stream cannot be continued on another engine.
  j["return_token_ids"] = true;
  if (resume_tokens_ == 0) return Dump(std::move(j));
  if (IsChat(route_)) return ChatReplayBody();
  std::vector<int32_t> prompt = *prompt_ids_;
  prompt.insert(prompt.end(), sent_ids_.begin(), sent_ids_.end());
  j["prompt"] = prompt;
  j["max_tokens"] = max_tokens_.value_or(kDefaultMaxTokens) - static_cast<int64_t>(resume_tokens_);
  j["seed"] = *seed_;
  ReduceMinTokens(body_, resume_tokens_, &j);
  j["baton_resume_tokens"] = resume_tokens_;
  return Dump(std::move(j));
}

// A chat stream continues on /v1/completions: the prompt's ids (the chat template applied by
// the engine) and the ids sent, the same sampling, the client's limit less what was sent (none
// when the client gave none: the engine then allows the context's room, as for the chat).
std::string StreamReplay::ChatReplayBody() const {
  Json j = Json::object();
  for (const char* key : kCarriedSamplingFields) {
    if (auto it = body_.find(key); it != body_.end()) j[key] = *it;
  }
  std::vector<int32_t> prompt = *prompt_ids_;
  prompt.insert(prompt.end(), sent_ids_.begin(), sent_ids_.end());
  j["prompt"] = prompt;
  if (max_tokens_) j["max_tokens"] = *max_tokens_ - static_cast<int64_t>(resume_tokens_);
  j["seed"] = *seed_;
  ReduceMinTokens(body_, resume_tokens_, &j);
  j["return_token_ids"] = true;
  j["baton_resume_tokens"] = resume_tokens_;
  return Dump(std::move(j));
}

// The router's key replaces any the client gave: keys name KV caches on the engines, so a
// client must not pick one (nor claim another request's). So does its resume count: the
// engine takes the prompt's last `baton_resume_tokens` ids as already generated, which only
// a continuation the router built may say.
std::string StreamReplay::Dump(Json body) const {
  if (request_key_.empty()) {
    body.erase("baton_request_key");
  } else {
    body["baton_request_key"] = request_key_;
  }
  if (resume_tokens_ == 0) body.erase("baton_resume_tokens");
  return body.dump(-1, ' ', false, Json::error_handler_t::replace);
}

bool StreamReplay::CanContinue() const {
  if (finished_ || events_sent_ == 0) return true;
  if (!stream_ || !(IsCompletions(route_) || IsChat(route_)) || !ids_known_ || !prompt_ids_ ||
      !seed_) {
    return false;
  }
  if (IsChat(route_) && !max_tokens_) return true;
  return max_tokens_.value_or(kDefaultMaxTokens) > static_cast<int64_t>(sent_ids_.size());
}

void StreamReplay::Learn(const Json& j) {
  if (id_.is_null()) {
    id_ = j.value("id", Json());
    created_ = j.value("created", Json());
    model_ = j.value("model", Json());
  }
  if (!seed_) {
    if (auto it = j.find("seed"); it != j.end()) seed_ = SeedOf(*it);
  }
  auto choices = j.find("choices");
  if (choices == j.end() || !choices->is_array() || choices->empty()) return;
  const Json& c = (*choices)[0];
  if (resume_tokens_ == 0) {  // per choice on completions; at the top level on chat (vLLM)
    const Json* ids = nullptr;
    if (auto it = c.find("prompt_token_ids"); it != c.end() && !it->is_null()) {
      ids = &*it;
    } else if (auto top = j.find("prompt_token_ids"); top != j.end() && !top->is_null()) {
      ids = &*top;
    }
    if (ids != nullptr) prompt_ids_ = PromptIds(*ids);
  }
  auto ids = c.find("token_ids");
  if (ids != c.end() && ids->is_array()) {
    for (const Json& v : *ids) {
      if (v.is_number_integer()) sent_ids_.push_back(v.get<int32_t>());
    }
  } else if (!(c.is_object() && CarriesNoToken(c))) {
    ids_known_ = false;
  }
  if (c.is_object() && OtherThanContent(c)) ids_known_ = false;  // not continued as text
  // With several sequences one finishing says nothing of the others: only [DONE] ends.
  if (auto it = c.find("finish_reason"); it != c.end() && !it->is_null() && single_) {
    finished_ = true;
  }
}

std::string StreamReplay::Rewrite(Json j) const {
  if (replaying_chat()) j = ChatChunkOf(j);
  j["id"] = id_;
  j["created"] = created_;
  if (auto choices = j.find("choices"); choices != j.end() && choices->is_array()) {
    for (Json& c : *choices) {
      if (c.is_object()) c.erase("prompt_token_ids");
    }
  }
  j.erase("prompt_token_ids");  // a chat stream's, at the top level
  if (auto usage = j.find("usage"); usage != j.end() && !usage->is_null()) *usage = UsageJson();
  return Event(j);
}

// A completions event of a chat stream's continuation, as the chat chunk the client expects:
// each choice's text becomes its delta's content, the token ids stay.
Json StreamReplay::ChatChunkOf(const Json& event) const {
  Json j;
  j["id"] = id_;
  j["object"] = "chat.completion.chunk";
  j["created"] = created_;
  j["model"] = model_;
  if (seed_) j["seed"] = *seed_;
  j["choices"] = Json::array();
  if (auto choices = event.find("choices"); choices != event.end() && choices->is_array()) {
    for (const Json& c : *choices) {
      if (!c.is_object()) continue;
      Json chunk;
      chunk["index"] = c.value("index", Json(0));
      chunk["delta"] = Json{{"content", c.value("text", Json(""))}};
      chunk["logprobs"] = nullptr;
      chunk["finish_reason"] = c.value("finish_reason", Json());
      if (auto ids = c.find("token_ids"); ids != c.end()) chunk["token_ids"] = *ids;
      j["choices"].push_back(std::move(chunk));
    }
  }
  if (auto usage = event.find("usage"); usage != event.end()) j["usage"] = *usage;
  return j;
}

Json StreamReplay::UsageJson() const {
  const int64_t prompt = prompt_ids_ ? static_cast<int64_t>(prompt_ids_->size()) : 0;
  const int64_t completion = static_cast<int64_t>(sent_ids_.size());
  Json u;
  u["prompt_tokens"] = prompt;
  u["completion_tokens"] = completion;
  u["total_tokens"] = prompt + completion;
  return u;
}

StreamReplay::Outcome StreamReplay::OnEvent(const std::string& event) {
  Outcome out;
  std::optional<std::string> data = EventData(event);
  if (!data) {
    out.to_client = event;  // a comment or keep-alive
    return out;
  }
  if (*data == "[DONE]") {
    out.done = true;
    out.to_client = event;
    ++events_sent_;
    return out;
  }
  Json j = ParseBounded(*data);
  ++events_sent_;
  if (!j.is_object()) {
    ids_known_ = false;
    out.to_client = event;
    return out;
  }
  if (auto err = j.find("error"); err != j.end()) {
    auto type = err->is_object() ? err->find("type") : err->end();
    if (type != err->end() && *type == "server_error") {
      --events_sent_;
      out.engine_failed = true;
      return out;
    }
    out.to_client = event;
    return out;
  }
  const size_t before = sent_ids_.size();
  if (auto usage = j.find("usage"); usage != j.end() && !usage->is_null()) usage_sent_ = true;
  Learn(j);
  out.first_token = before == 0 && !sent_ids_.empty();
  out.new_tokens = sent_ids_.size() > before;
  if (resent_ && !out.new_tokens && NoTokenEvent(j)) return out;  // sent by the attempt before
  out.to_client = resent_ ? Rewrite(std::move(j)) : event;
  return out;
}

std::string StreamReplay::FinishingEvents() const {
  std::string out;
  if (include_usage_ && !usage_sent_) {
    Json j;
    j["id"] = id_;
    j["object"] = IsChat(route_) ? "chat.completion.chunk" : "text_completion";
    j["created"] = created_;
    j["model"] = model_;
    if (seed_) j["seed"] = *seed_;
    j["choices"] = Json::array();
    j["usage"] = UsageJson();
    out += Event(j);
  }
  return out + "data: [DONE]\n\n";
}

std::string StreamReplay::EndingEvents(const std::string& message) const {
  Json inner;
  inner["message"] = message;
  inner["type"] = "server_error";
  inner["param"] = nullptr;
  inner["code"] = "engine_failed";
  Json j;
  j["error"] = inner;
  return Event(j) + "data: [DONE]\n\n";
}

}  // namespace baton
