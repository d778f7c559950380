// RoundUp: the smallest multiple of a unit at or above a value (sizes, offsets, addresses).
#pragma once

#include <cstdint>

namespace baton {

// `unit` must be positive; `value + unit - 1` must not overflow.
constexpr uint64_t RoundUp(uint64_t value, uint64_t unit) {
  return (value + unit - 1) / unit * unit;
}

}  // namespace baton
