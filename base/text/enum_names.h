// EnumNames: the one table of an enum's names behind its ToString and Parse: each value's
// name, and a name parsed back, with an error that lists every name.
//
//   constexpr EnumNames<DrillKind, 3> kNames{
//       "drill", {{{DrillKind::kKill, "kill"}, {DrillKind::kHang, "hang"}, ...}}};
//   const char* ToString(DrillKind kind) { return kNames.Name(kind); }
//
// Constant data; any thread.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <string_view>

#include "base/status.h"

namespace baton {

template <typename E, size_t N>
struct EnumNames {
  struct Entry {
    E value;
    const char* name;
  };
  const char* what;  // what a name names, for the error: "drill", "upgrade phase"
  std::array<Entry, N> entries;

  // `value`'s name; "unknown" for a value the table does not hold.
  constexpr const char* Name(E value) const {
    for (const Entry& e : entries) {
      if (e.value == value) return e.name;
    }
    return "unknown";
  }

  // The value named `text`; InvalidArgument naming `text` and listing every name otherwise:
  // "unknown drill 'x' (kill, hang or error)".
  Result<E> Parse(std::string_view text) const {
    for (const Entry& e : entries) {
      if (text == e.name) return e.value;
    }
    std::string names;
    for (size_t i = 0; i < N; ++i) {
      names += i == 0 ? "" : i + 1 == N ? " or " : ", ";
      names += entries[i].name;
    }
    return InvalidArgument("unknown " + std::string(what) + " '" + std::string(text) + "' (" +
                           names + ")");
  }
};

}  // namespace baton
