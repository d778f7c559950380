// JsonField: one typed field of a parsed JSON object, for the small files the daemons keep
// (the roster, the memory record): a missing or mistyped field is InvalidArgument naming
// `where` and the key, never an exception; an integer field must be an integer T holds
// (JsonIntegerFits), never a fraction cut or a wide number wrapped into another value.
// Header-only; thread-compatible.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>
#include <utility>

#include "base/status.h"

namespace baton {

// Whether `v` is a JSON integer that T holds: get<T> would wrap one T cannot hold (a pid of
// 2^32 + 1 read as 1) and cut a fraction.
template <typename T>
bool JsonIntegerFits(const nlohmann::json& v) {
  static_assert(std::is_integral_v<T> && !std::is_same_v<T, bool>);
  if (!v.is_number_integer()) return false;
  return v.is_number_unsigned() ? std::in_range<T>(v.get<uint64_t>())
                                : std::in_range<T>(v.get<int64_t>());
}

template <typename T>
Status JsonField(const nlohmann::json& j, const char* key, const std::string& where, T* out) {
  auto it = j.find(key);
  if (it == j.end()) return InvalidArgument(where + ": '" + key + "' is missing");
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    if (!JsonIntegerFits<T>(*it)) {
      return InvalidArgument(where + ": '" + key + "' is not an integer in range: " + it->dump());
    }
  }
  try {
    *out = it->template get<T>();
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument(where + ": '" + key + "': " + e.what());
  }
  return OkStatus();
}

}  // namespace baton
