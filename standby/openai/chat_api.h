// Chat completions: the OpenAI-compatible `POST /v1/chat/completions` of the reference engine.
// Parsing shares every field with /v1/completions (completions_api.h) except the prompt,
// which is `messages` rendered by the chat template below, and the length limit, which is
// `max_completion_tokens` (or the older `max_tokens`), by default the room left in the
// model's context, as vLLM does.
//
// The chat template of Baton's byte-level models: the bos id, then for each message
// "<|ROLE|>\n" CONTENT "\n", then "<|assistant|>\n", the start of the answer. Roles are
// system, developer, user, assistant and tool; content is a string or an array of text parts
// ({"type": "text", "text": ...}). Other parts (images, audio) and tool calls are refused.
//
// Responses have OpenAI's chat shapes (`chat.completion`, `chat.completion.chunk` with a
// `delta`) plus, as vLLM returns them when asked, the prompt's ids (`prompt_token_ids`, top
// level, on the response and on the stream's first event), each choice's generated
// `token_ids`, and the request's `seed`, so that a router can continue an interrupted chat
// stream on token ids (docs/router.md). Plain functions; thread-compatible.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "standby/openai/completions_api.h"

namespace baton {

// The prompt text of `messages` (the request's JSON value) into *prompt, or the 400 that
// OpenAI's API answers, naming the field: `param` is its path ("messages[2].content[0].type"),
// `code` "missing_required_parameter" when it is absent. Checked: each message an object; a
// known role; content present (null only for an assistant with tool calls, which are
// refused: the template has none), a string or a non-empty array of text parts; a tool's
// tool_call_id and any name strings.
std::optional<ApiError> RenderChatPrompt(const nlohmann::json& messages, std::string* prompt);
// The same, the error as InvalidArgument with its message.
Result<std::string> RenderChatPrompt(const nlohmann::json& messages);

// The non-streamed response body.
std::string ChatBody(const CompletionHeader& header, std::string_view text,
                     std::string_view finish_reason, const std::vector<int32_t>& token_ids,
                     const std::vector<int32_t>& prompt_ids, const CompletionUsage& usage);

// One streamed event's JSON. The first event (`prompt_ids` set) carries the role in its delta
// and the prompt's ids; an empty `finish_reason` is null.
std::string ChatChunk(const CompletionHeader& header, std::string_view text,
                      std::string_view finish_reason, const std::vector<int32_t>& token_ids,
                      const std::vector<int32_t>* prompt_ids);
// The last event when stream_options.include_usage is set: no choices, the usage.
std::string ChatUsageChunk(const CompletionHeader& header, const CompletionUsage& usage);

}  // namespace baton
