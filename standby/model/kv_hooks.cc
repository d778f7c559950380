#include "standby/model/kv_hooks.h"

namespace baton {
namespace {

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string KvRequestKey::ToHex() const {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(32, '0');
  for (int i = 0; i < 16; ++i) {
    out[15 - i] = kDigits[(hi >> (4 * i)) & 0xF];
    out[31 - i] = kDigits[(lo >> (4 * i)) & 0xF];
  }
  return out;
}

std::optional<KvRequestKey> KvRequestKey::FromHex(std::string_view text) {
  if (text.size() != 32) return std::nullopt;
  KvRequestKey key;
  for (size_t i = 0; i < 32; ++i) {
    const int d = HexDigit(text[i]);
    if (d < 0) return std::nullopt;
    uint64_t& half = i < 16 ? key.hi : key.lo;
    half = (half << 4) | static_cast<uint64_t>(d);
  }
  if (key.empty()) return std::nullopt;
  return key;
}

}  // namespace baton
