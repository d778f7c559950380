// Nesting depth of TOML text, measured without parsing it.
//
// toml11 parses arrays and inline tables by recursion: a config file of a few thousand nested
// brackets overflows the stack and the process dies with SIGSEGV before it can say what is
// wrong. Readers of config files refuse text nested deeper than a small bound first.
#pragma once

#include <string>
#include <string_view>

#include "base/status.h"

namespace baton {

// The deepest level of '[' / '{' nesting in `text`, ignoring brackets inside strings (basic
// and literal, single- and multi-line) and comments. A table header counts as one level.
// Text that is not TOML gets a number too; the parser refuses it later.
int TomlNestingDepth(std::string_view text);

// Far beyond what any config needs (Baton's are at most three levels deep).
inline constexpr int kMaxTomlDepth = 32;

// InvalidArgument naming `source` when `text` nests deeper than kMaxTomlDepth.
Status CheckTomlDepth(std::string_view text, const std::string& source);

}  // namespace baton
