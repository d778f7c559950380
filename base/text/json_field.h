// JsonField: one typed field of a parsed JSON object, for the small files the daemons keep
// (the roster, the memory record): a missing or mistyped field is InvalidArgument naming
// `where` and the key, never an exception. Header-only; thread-compatible.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "base/status.h"

namespace baton {

template <typename T>
Status JsonField(const nlohmann::json& j, const char* key, const std::string& where, T* out) {
  auto it = j.find(key);
  if (it == j.end()) return InvalidArgument(where + ": '" + key + "' is missing");
  try {
    *out = it->template get<T>();
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument(where + ": '" + key + "': " + e.what());
  }
  return OkStatus();
}

}  // namespace baton
