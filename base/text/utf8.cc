#include "base/text/utf8.h"

#include <cstdint>

namespace baton {

int Utf8SequenceAt(std::string_view s, size_t p, bool* truncated) {
  *truncated = false;
  const uint8_t b = static_cast<uint8_t>(s[p]);
  int len = 0;
  uint8_t lo = 0x80, hi = 0xBF;  // the range of the second byte
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) len = 2;
  if (b >= 0xE0 && b <= 0xEF) len = 3;
  if (b >= 0xF0 && b <= 0xF4) len = 4;
  if (len == 0) return 0;
  if (b == 0xE0) lo = 0xA0;
  if (b == 0xED) hi = 0x9F;
  if (b == 0xF0) lo = 0x90;
  if (b == 0xF4) hi = 0x8F;
  for (int i = 1; i < len; ++i) {
    if (p + i >= s.size()) {
      *truncated = true;
      return 0;
    }
    const uint8_t c = static_cast<uint8_t>(s[p + i]);
    if (i == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) return 0;
  }
  return len;
}

std::optional<size_t> FirstInvalidUtf8(std::string_view text) {
  for (size_t p = 0; p < text.size();) {
    bool truncated = false;
    const int len = Utf8SequenceAt(text, p, &truncated);
    if (len == 0) return p;
    p += static_cast<size_t>(len);
  }
  return std::nullopt;
}

}  // namespace baton
