// Readers of the fields of an OpenAI request body, shared by the completions and chat parsers
// (completions_api.h) and the vLLM sampling extensions (ReadVllmParams). Each returns the 400
// that names the field when its value has the wrong type or range; an absent or null field
// leaves the output as it was. Plain functions; thread-safe.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "standby/openai/completions_api.h"

namespace baton {

// A 400 invalid_request_error naming `param`.
ApiError ParamError(std::string param, std::string message);

// The 400 for a parameter this engine does not implement, set to other than `only`.
ApiError NotSupported(const std::string& name, const std::string& only);

bool IsJsonInteger(const nlohmann::json& j);

// An optional integer that fits int64_t; *present says whether it was given.
std::optional<ApiError> ReadInt(const nlohmann::json& body, const char* name, int64_t* out,
                                bool* present);

// A number in [lo, hi] (or (lo, hi] when lo_open); `range` spells the interval.
std::optional<ApiError> ReadNumber(const nlohmann::json& body, const char* name, double lo,
                                   double hi, bool lo_open, const char* range, float* out);

std::optional<ApiError> ReadBool(const nlohmann::json& body, const char* name, bool* out);

// vLLM's sampling extensions: min_tokens (in [0, max_tokens]; ReadMaxTokens runs first),
// ignore_eos, stop_token_ids (at most kMaxStopTokenIds ids of the vocabulary). top_k, min_p
// and repetition_penalty are checked for type and range and refused unless they change
// nothing (top_k -1 or 0, min_p 0, repetition_penalty 1): never ignored.
std::optional<ApiError> ReadVllmParams(const nlohmann::json& body, const CompletionContext& ctx,
                                       CompletionRequest* req);

inline constexpr size_t kMaxStopTokenIds = 64;

}  // namespace baton
