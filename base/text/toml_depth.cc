#include "base/text/toml_depth.h"

#include <algorithm>
#include <vector>

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

// Walks TOML text one character at a time (strings and comments skipped by the caller) and
// keeps the deepest nesting seen. A key's dots count where a key is read: at the start of a
// top-level line, in a table header, and after '{' or ',' in an inline table. A key line's
// depth adds to its table header's, and a value's brackets to its key's.
class DepthScanner {
 public:
  void Take(char c) {
    switch (c) {
      case '\n':
        return NewLine();
      case '[':
        return OpenBracket();
      case '{':
        return Open('{', /*key_follows=*/true);
      case ']':
      case '}':
        return Close();
      case '=':
        return EndKey();
      case '.':
        return Dot();
      case ',':
        return Comma();
      case ' ':
      case '\t':
      case '\r':
        return;
      default:
        line_started_ = true;
    }
  }
  // Called for a string too: a quoted key starts a line like a bare one.
  void TakeString() { line_started_ = true; }
  int deepest() const { return deepest_; }

 private:
  struct Frame {
    char open;
    int base;   // the depth of what the frame holds
    int outer;  // the value depth around the frame, restored when it closes
  };

  int KeyBase() const { return frames_.empty() ? header_depth_ : frames_.back().base; }
  void Reach(int depth) { deepest_ = std::max(deepest_, depth); }

  void NewLine() {
    if (!frames_.empty()) return;  // a multi-line array goes on
    in_key_ = true;
    in_header_ = false;
    line_started_ = false;
    key_dots_ = 0;
    value_base_ = header_depth_;
  }
  void OpenBracket() {
    if (frames_.empty() && in_key_ && !line_started_) {  // a table header: [x] or [[x]]
      if (!in_header_) header_depth_ = 0;
      in_header_ = true;
      Reach(++header_depth_);
      return;
    }
    Open('[', /*key_follows=*/false);
  }
  void Open(char open, bool key_follows) {
    frames_.push_back({open, value_base_ + 1, value_base_});
    Reach(value_base_ + 1);
    in_key_ = key_follows;
    line_started_ = true;
    key_dots_ = 0;
    value_base_ = frames_.back().base;
  }
  void Close() {
    if (in_header_) {  // the header's key ends; its dots are part of its depth
      in_header_ = false;
      in_key_ = false;
      header_depth_ += key_dots_;
      key_dots_ = 0;
      value_base_ = header_depth_;
      return;
    }
    if (frames_.empty()) return;
    value_base_ = frames_.back().outer;
    frames_.pop_back();
    in_key_ = false;
  }
  void EndKey() {
    if (!in_key_) return;
    in_key_ = false;
    value_base_ = KeyBase() + key_dots_;
    key_dots_ = 0;
  }
  void Dot() {
    if (!in_key_) return;  // a number or a date
    ++key_dots_;
    Reach(KeyBase() + key_dots_);  // in a header, KeyBase() is the header's
  }
  void Comma() {
    if (frames_.empty() || frames_.back().open != '{') return;
    in_key_ = true;
    key_dots_ = 0;
  }

  std::vector<Frame> frames_;
  int header_depth_ = 0;  // of the last table header: its brackets and its key's dots
  int value_base_ = 0;
  int key_dots_ = 0;
  int deepest_ = 0;
  bool in_key_ = true;
  bool in_header_ = false;
  bool line_started_ = false;
};

}  // namespace

int TomlNestingDepth(std::string_view text) {
  DepthScanner scanner;
  size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (c == '"' || c == '\'') {
      scanner.TakeString();
      i = SkipString(text, i);
      continue;
    }
    if (c == '#') {
      const size_t end = text.find('\n', i);
      i = end == std::string_view::npos ? text.size() : end;
      continue;
    }
    scanner.Take(c);
    ++i;
  }
  return scanner.deepest();
}

Status CheckTomlDepth(std::string_view text, const std::string& source) {
  const int depth = TomlNestingDepth(text);
  if (depth <= kMaxTomlDepth) return OkStatus();
  return InvalidArgument(source + ": arrays, tables and dotted keys nested " +
                         std::to_string(depth) + " deep (at most " + std::to_string(kMaxTomlDepth) +
                         ")");
}

}  // namespace baton
