// Base64 (RFC 4648, the standard alphabet, padded), as etcd's v3 JSON API writes keys and
// values.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace baton {

std::string Base64Encode(std::string_view bytes);
// The bytes of `text`; nullopt unless it is canonical padded base64 (length a multiple of 4,
// only the alphabet, `=` only at the end).
std::optional<std::string> Base64Decode(std::string_view text);

}  // namespace baton
