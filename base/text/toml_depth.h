// Nesting depth of TOML text, measured without parsing it.
//
// toml11 parses arrays and inline tables by recursion, and builds (and copies) a dotted key's
// tables by recursion too: a config file of a few thousand nested brackets, or a key of a few
// thousand dotted segments (a.a.a... = 1, [a.a.a...]), overflows the stack and the process
// dies with SIGSEGV before it can say what is wrong. Readers of config files refuse text
// nested deeper than a small bound first.
#pragma once

#include <string>
#include <string_view>

#include "base/status.h"

namespace baton {

// The deepest level of nesting in `text`: '[' / '{' brackets and the dots of keys (in table
// headers, key/value lines and inline tables), ignoring brackets and dots inside strings
// (basic and literal, single- and multi-line; quoted keys too) and comments. A table header
// counts as one level per bracket and per dot, and the keys under it add to that; a value's
// brackets add to its key's dots (a.b = [1] is 2 deep).
// Text that is not TOML gets a number too; the parser refuses it later.
int TomlNestingDepth(std::string_view text);

// Far beyond what any config needs (Baton's are at most three levels deep).
inline constexpr int kMaxTomlDepth = 32;

// InvalidArgument naming `source` when `text` nests deeper than kMaxTomlDepth.
Status CheckTomlDepth(std::string_view text, const std::string& source);

}  // namespace baton
