#include "weightcache/safetensors/safetensors_json.h"

#include <exception>
#include <string>
#include <unordered_set>
#include <vector>

#include "weightcache/safetensors/json_events.h"
#include "weightcache/safetensors/safetensors_index.h"

namespace baton {
namespace {

using Json = nlohmann::json;

constexpr int kMaxJsonDepth = 16;
constexpr std::string_view kMetadataKey = "__metadata__";

// Thrown from inside the nlohmann parser callback to stop a parse; caught in ParseJson.
struct ParseStop {
  Status status;
};

std::string HexByte(char c) {
  static constexpr char kHex[] = "0123456789abcdef";
  const auto b = static_cast<unsigned char>(c);
  return std::string("0x") + kHex[b >> 4] + kHex[b & 0xf];
}

// Where the top-level JSON object that opens `text` ends (one past its '}'), found by
// tracking strings and bracket depth; npos when it never closes. Validation is nlohmann's.
size_t EndOfTopLevelObject(std::string_view text) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      if (--depth == 0) return i + 1;
    }
  }
  return std::string_view::npos;
}

// Keys seen so far in each open object, by depth, so that a repeated key (which nlohmann
// keeps silently, dropping the first) is refused.
struct KeyTracker {
  std::vector<std::unordered_set<std::string>> seen;
  std::vector<std::string> last;

  void Open(size_t d) {
    if (seen.size() <= d) {
      seen.resize(d + 1);
      last.resize(d + 1);
    }
    seen[d].clear();
    last[d].clear();
  }
};

Status DuplicateKeyError(std::string_view file, const KeyTracker& keys, size_t d,
                         const std::string& key) {
  constexpr std::string_view kRule = "duplicate-key";
  if (d == 0) {
    if (key == kMetadataKey) return SafetensorsFileError(file, "__metadata__ appears twice", kRule);
    return SafetensorsTensorError(file, key, "tensor name appears twice in the header", kRule);
  }
  const std::string& top = keys.last[0];
  if (top == kMetadataKey) {
    return SafetensorsFileError(file, "__metadata__ key '" + PrintableName(key) + "' appears twice",
                                kRule);
  }
  return SafetensorsTensorError(
      file, top, "field '" + PrintableName(key) + "' appears twice in its entry", kRule);
}

bool OnParseEvent(std::string_view file, KeyTracker& keys, int depth, Json::parse_event_t event,
                  Json& parsed) {
  switch (event) {
    case Json::parse_event_t::object_start:
    case Json::parse_event_t::array_start:
      if (depth >= kMaxJsonDepth) {
        throw ParseStop{SafetensorsFileError(
            file, "JSON is nested more than " + std::to_string(kMaxJsonDepth) + " levels deep",
            "header-nesting")};
      }
      if (event == Json::parse_event_t::object_start) keys.Open(static_cast<size_t>(depth));
      break;
    case Json::parse_event_t::key: {
      // A key is reported at the depth of the object holding it plus one.
      const size_t d = depth > 0 ? static_cast<size_t>(depth - 1) : 0;
      if (keys.seen.size() <= d) keys.Open(d);
      const std::string& key = parsed.get_ref<const std::string&>();
      if (!keys.seen[d].insert(key).second) throw ParseStop{DuplicateKeyError(file, keys, d, key)};
      keys.last[d] = key;
      break;
    }
    default:
      break;
  }
  return true;
}

Status ParseJson(std::string_view file, std::string_view text, Json* out) {
  KeyTracker keys;
  try {
    *out = ParseJsonWithEvents(text, [&](int depth, Json::parse_event_t event, Json& parsed) {
      return OnParseEvent(file, keys, depth, event, parsed);
    });
  } catch (const ParseStop& stop) {
    return stop.status;
  } catch (const Json::exception& e) {
    return SafetensorsFileError(file, "header is not valid JSON: " + PrintableName(e.what(), 300),
                                "header-json");
  } catch (const std::exception& e) {
    return SafetensorsFileError(file, std::string("header could not be parsed: ") + e.what(),
                                "header-json");
  }
  return OkStatus();
}

}  // namespace

Status ParseSafetensorsHeaderJson(std::string_view name, std::string_view json, Json* root) {
  if (json.empty() || json.front() != '{') {
    return SafetensorsFileError(
        name,
        json.empty() ? "header is empty"
                     : "header begins with byte " + HexByte(json.front()) + " instead of '{'",
        "header-begins-with-brace");
  }
  const size_t object_end = EndOfTopLevelObject(json);
  BATON_RETURN_IF_ERROR(ParseJson(name, json.substr(0, object_end), root));
  if (!root->is_object()) {
    return SafetensorsFileError(name, "header is not a JSON object", "header-begins-with-brace");
  }
  const size_t pad = json.find_first_not_of(' ', object_end);
  if (object_end != std::string_view::npos && pad != std::string_view::npos) {
    return SafetensorsFileError(name,
                                "header byte " + std::to_string(pad) + " (" + HexByte(json[pad]) +
                                    ") follows the JSON object; only spaces (0x20) may pad it",
                                "header-padding");
  }
  return OkStatus();
}

}  // namespace baton
