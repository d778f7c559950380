// The JSON layer of a safetensors header: its framing and a strict parse.
//
// ParseSafetensorsHeaderJson() checks the rules that concern the header as text and JSON
// (header-begins-with-brace, header-padding, header-json, header-nesting, duplicate-key; see
// safetensors_index.h for the list) and hands back the parsed object. nlohmann keeps the last
// of two equal keys silently, so duplicates are caught in its parser callback. What the
// entries mean (dtypes, shapes, offsets, tiling) is SafetensorsIndex's business.
// Stateless functions; thread-safe. No exception leaves them.
#pragma once

#include <nlohmann/json.hpp>
#include <string_view>

#include "base/status.h"

namespace baton {

// `json` is the header's N bytes; `file` names the file in messages. On success *root is a
// JSON object.
Status ParseSafetensorsHeaderJson(std::string_view file, std::string_view json,
                                  nlohmann::json* root);

}  // namespace baton
