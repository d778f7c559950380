// NewRequestKey: the key the router gives each client request, sent to the engine on every
// attempt as `baton_request_key` (docs/router.md, Lossless replay). An engine that takes over
// a failed attempt finds, by this key, the KV cache the failed engine left for the request
// (KV-warm failover); a key must therefore never be guessed, chosen by a client or reused.
//
// 128 random bits as 32 lowercase hex digits, from getrandom(2) (a thread-local
// std::mt19937_64 seeded from std::random_device should the kernel refuse). Any thread.
#pragma once

#include <string>
#include <string_view>

namespace baton {

inline constexpr size_t kRequestKeyHexDigits = 32;

std::string NewRequestKey();

// Whether `key` has the shape NewRequestKey() gives: 32 lowercase hex digits.
bool IsRequestKey(std::string_view key);

}  // namespace baton
