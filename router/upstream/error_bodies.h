// The OpenAI-shaped error bodies the router writes itself when no engine answers a request
// (an unknown model, a drained pair), and the message read out of an engine's error body.
// Plain functions; thread-safe.
#pragma once

#include <string>

namespace baton {

// A model no node serves, shaped as an engine answers an unknown model (OpenAI's 404), so
// that a client reads the same error from a fleet's router as from one engine.
std::string ModelNotFoundJson(const std::string& message);

// The service taken out of service by its operator (`batonctl drain`): a 503 whose code says
// that no engine comes back by itself, unlike a failover's wait.
std::string OutOfServiceJson(const std::string& message);

// The message of an OpenAI-shaped error body, or the body itself (its first 200 bytes).
std::string ErrorMessage(const std::string& body);

}  // namespace baton
