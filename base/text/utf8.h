// UTF-8 validity of byte strings.
//
// JSON text is UTF-8: nlohmann-json refuses (throws on) a string with other bytes when it
// prints it strictly. Text that a daemon stores as JSON and must keep byte for byte (an
// engine command line in the command record) is checked when it comes in, and refused with
// the position of the first bad byte. The reference engine builds its output text from
// byte-level tokens with the same sequence rule (standby/openai/completion_text.h).
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

namespace baton {

// Length of the complete, valid UTF-8 sequence that starts at text[p] (overlong forms,
// surrogates and code points past U+10FFFF are not valid), or 0 when none starts there.
// *truncated is set when the bytes from p to the end are the beginning of a valid sequence.
int Utf8SequenceAt(std::string_view text, size_t p, bool* truncated);

// The offset of the first byte of `text` that does not start a complete, valid UTF-8
// sequence, or nullopt when all of it is valid.
std::optional<size_t> FirstInvalidUtf8(std::string_view text);

inline bool IsValidUtf8(std::string_view text) { return !FirstInvalidUtf8(text).has_value(); }

}  // namespace baton
