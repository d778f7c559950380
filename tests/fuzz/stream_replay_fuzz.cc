// Fuzz target for the router's lossless-stream path: a client's body and the SSE streams that
// engines send back, as the router cuts and rewrites them (SseSplitter, StreamReplay).
//
// The input is: one byte choosing the route, the client's body, then up to three engine
// streams, the parts separated by NUL bytes. Each stream is one attempt; a later attempt is
// made only when the generation has not finished and the replay says it can continue, as
// the router does. Checked:
//   - cutting a stream into events gives the same events whole and in small reads;
//   - a replay's body is a JSON object whose prompt ends with every token id already sent,
//     with max_tokens at least 1 (or none, for a chat stream with no limit), the same seed
//     and baton_resume_tokens = the ids sent, sent to /v1/completions;
//   - every event rewritten for the client (an engine's event whose data is a JSON object,
//     on a replay), and the finishing and ending events, are whole SSE events whose data is
//     JSON (or [DONE]).
// Nothing may crash or throw.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "router/stream/sse_splitter.h"
#include "router/stream/stream_replay.h"

namespace {

using Json = nlohmann::json;

std::vector<std::string_view> SplitParts(std::string_view input) {
  std::vector<std::string_view> parts;
  size_t pos = 0;
  while (parts.size() < 4) {
    const size_t nul = input.find('\0', pos);
    parts.push_back(input.substr(pos, nul == std::string_view::npos ? nul : nul - pos));
    if (nul == std::string_view::npos) break;
    pos = nul + 1;
  }
  return parts;
}

std::vector<std::string> Events(std::string_view stream, size_t chunk, size_t* pending) {
  baton::SseSplitter splitter;
  std::vector<std::string> events;
  for (size_t pos = 0; pos < stream.size(); pos += chunk) {
    splitter.Feed(stream.substr(pos, chunk), &events);
  }
  *pending = splitter.pending();
  return events;
}

// `text` must be whole events, each with JSON or [DONE] as its data.
void CheckWholeEvents(const std::string& text) {
  size_t pending = 0;
  const std::vector<std::string> events = Events(text, text.size() + 1, &pending);
  if (pending != 0) std::abort();
  for (const std::string& e : events) {
    std::optional<std::string> data = baton::EventData(e);
    if (!data) std::abort();
    if (*data != "[DONE]" && Json::parse(*data, nullptr, false).is_discarded()) std::abort();
  }
}

void CheckReplayBody(const std::string& body, const baton::StreamReplay& replay, bool chat) {
  const Json j = Json::parse(body, nullptr, false);
  if (!j.is_object() || !j["prompt"].is_array() || !j["seed"].is_number_integer()) std::abort();
  const std::vector<int32_t>& sent = replay.sent_ids();
  const Json& prompt = j["prompt"];
  if (prompt.size() < sent.size() + 1) std::abort();
  for (size_t i = 0; i < sent.size(); ++i) {
    if (prompt[prompt.size() - sent.size() + i] != sent[i]) std::abort();
  }
  // A chat stream whose client set no limit is continued without one.
  if (!(chat && !j.contains("max_tokens")) &&
      (!j["max_tokens"].is_number_integer() || j["max_tokens"].get<int64_t>() < 1)) {
    std::abort();
  }
  if (chat && j.contains("messages")) std::abort();
  if (j["baton_resume_tokens"] != sent.size()) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string route = data[0] % 2 == 0 ? "/v1/completions" : "/v1/chat/completions";
  const std::vector<std::string_view> parts =
      SplitParts(std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1));
  baton::StreamReplay replay(route, std::string(parts[0]));
  for (size_t attempt = 1; attempt < parts.size(); ++attempt) {
    // As the router does: a stream whose generation finished is ended, not replayed.
    if (attempt > 1 && (replay.finished() || !replay.CanContinue())) break;
    replay.BeginAttempt();
    const std::string body = replay.AttemptBody();
    const bool resumed = replay.tokens_sent() > 0;
    if (resumed) {
      CheckReplayBody(body, replay, route != "/v1/completions");
      // A chat stream is continued on /v1/completions.
      if (replay.AttemptTarget(route) != "/v1/completions") std::abort();
    }
    size_t pending_whole = 0, pending_pieces = 0;
    const std::vector<std::string> events =
        Events(parts[attempt], parts[attempt].size() + 1, &pending_whole);
    if (events != Events(parts[attempt], size % 7 + 1, &pending_pieces) ||
        pending_whole != pending_pieces) {
      std::abort();
    }
    for (const std::string& event : events) {
      const baton::StreamReplay::Outcome out = replay.OnEvent(event);
      // An event whose data is not a JSON object is passed on as the engine sent it.
      std::optional<std::string> event_data = baton::EventData(event);
      if (resumed && !out.to_client.empty() && event_data &&
          Json::parse(*event_data, nullptr, false).is_object()) {
        CheckWholeEvents(out.to_client);
      }
      if (out.done || out.engine_failed) break;
    }
  }
  CheckWholeEvents(replay.FinishingEvents());
  CheckWholeEvents(replay.EndingEvents("the engine failed"));
  return 0;
}
