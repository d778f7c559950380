// Nesting depth of JSON text, measured without parsing it.
//
// Parsing JSON with nlohmann does not recurse, but copying, comparing and printing a parsed
// value does: a 100 KB body of nested brackets overflows a thread's stack. Daemons that take
// JSON from the network refuse text nested deeper than a small bound before they parse it.
#pragma once

#include <string_view>

namespace baton {

// The deepest level of '[' / '{' nesting in `text`, ignoring brackets inside strings (with
// backslash escapes). Text that is not JSON gets a number too; the parser refuses it later.
int JsonNestingDepth(std::string_view text);

// The bound used for request bodies and other JSON from peers.
inline constexpr int kMaxJsonDepth = 64;

}  // namespace baton
