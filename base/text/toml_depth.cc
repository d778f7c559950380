#include "base/text/toml_depth.h"

namespace baton {

namespace {

// The position just past the string that starts at `at` (a quote), or text.size() if it does
// not end.
size_t SkipString(std::string_view text, size_t at) {
  const char quote = text[at];
  const bool basic = quote == '"';
  const bool multi = text.substr(at, 3) == std::string_view(basic ? "\"\"\"" : "'''");
  const std::string_view close = multi ? text.substr(at, 3) : text.substr(at, 1);
  for (size_t i = at + close.size(); i < text.size(); ++i) {
    if (basic && text[i] == '\\') {
      ++i;  // the escaped character, whatever it is
      continue;
    }
    if (!multi && text[i] == '\n') return i;  // unterminated: the parser says so
    if (text.substr(i, close.size()) == close) return i + close.size();
  }
  return text.size();
}

}  // namespace

int TomlNestingDepth(std::string_view text) {
  int depth = 0;
  int deepest = 0;
  size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (c == '"' || c == '\'') {
      i = SkipString(text, i);
      continue;
    }
    if (c == '#') {
      const size_t end = text.find('\n', i);
      i = end == std::string_view::npos ? text.size() : end;
      continue;
    }
    if (c == '[' || c == '{') {
      if (++depth > deepest) deepest = depth;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
    ++i;
  }
  return deepest;
}

Status CheckTomlDepth(std::string_view text, const std::string& source) {
  const int depth = TomlNestingDepth(text);
  if (depth <= kMaxTomlDepth) return OkStatus();
  return InvalidArgument(source + ": arrays and tables nested " + std::to_string(depth) +
                         " deep (at most " + std::to_string(kMaxTomlDepth) + ")");
}

}  // namespace baton
