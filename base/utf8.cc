#include "base/utf8.h"

#include <cstdint>

namespace baton {
namespace {

// Length of the valid sequence at text[p], or 0.
size_t SequenceAt(std::string_view text, size_t p) {
  const uint8_t b = static_cast<uint8_t>(text[p]);
  if (b < 0x80) return 1;
  size_t len = 0;
  uint8_t lo = 0x80, hi = 0xBF;  // the range of the second byte
  if (b >= 0xC2 && b <= 0xDF) len = 2;
  if (b >= 0xE0 && b <= 0xEF) len = 3;
  if (b >= 0xF0 && b <= 0xF4) len = 4;
  if (len == 0 || p + len > text.size()) return 0;
  if (b == 0xE0) lo = 0xA0;  // overlong
  if (b == 0xED) hi = 0x9F;  // surrogates
  if (b == 0xF0) lo = 0x90;  // overlong
  if (b == 0xF4) hi = 0x8F;  // past U+10FFFF
  for (size_t i = 1; i < len; ++i) {
    const uint8_t c = static_cast<uint8_t>(text[p + i]);
    if (i == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) return 0;
  }
  return len;
}

}  // namespace

std::optional<size_t> FirstInvalidUtf8(std::string_view text) {
  for (size_t p = 0; p < text.size();) {
    const size_t len = SequenceAt(text, p);
    if (len == 0) return p;
    p += len;
  }
  return std::nullopt;
}

}  // namespace baton
