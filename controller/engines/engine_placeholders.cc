#include "controller/engines/engine_placeholders.h"

#include <algorithm>
#include <cctype>

namespace baton {
namespace {

bool IsName(const std::string& text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) != 0 || ch == '_';
  });
}

}  // namespace

const std::vector<std::string>& EnginePlaceholders() {
  static const std::vector<std::string> names = {"socket", "token", "role",      "engine_id",
                                                 "host",   "port",  "model_dir", "runtime_dir"};
  return names;
}

Status CheckPlaceholders(const std::vector<std::string>& command, const std::string& what) {
  const std::vector<std::string>& known = EnginePlaceholders();
  for (const std::string& word : command) {
    size_t pos = 0;
    while (pos < word.size()) {  // the scan of ExpandPlaceholders (supervisor.h)
      const size_t open = word.find('{', pos);
      const size_t close = open == std::string::npos ? open : word.find('}', open);
      if (close == std::string::npos) break;
      const std::string name = word.substr(open + 1, close - open - 1);
      const bool shell = open > 0 && word[open - 1] == '$';
      if (!shell && IsName(name) && std::find(known.begin(), known.end(), name) == known.end()) {
        std::string list;
        for (const std::string& k : known) list += (list.empty() ? "{" : " {") + k + "}";
        return InvalidArgument(what + ": unknown placeholder {" + name + "} in '" + word +
                               "'; the placeholders are " + list);
      }
      pos = close + 1;
    }
  }
  return OkStatus();
}

}  // namespace baton
