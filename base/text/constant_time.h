// ConstantTimeEquals: whether two secrets (an API key, a launch token) are equal, in a time
// that depends on their lengths only, not on where they first differ, so that a peer timing
// refusals learns nothing of the secret's bytes. Lengths are not secret here (keys and tokens
// have fixed, known sizes). Thread-safe.
#pragma once

#include <cstddef>
#include <string_view>

namespace baton {

inline bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  // volatile: the compiler may not stop at the first difference it finds.
  volatile unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = diff | static_cast<unsigned char>(a[i] ^ b[i]);
  }
  return diff == 0;
}

}  // namespace baton
