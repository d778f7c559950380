#include "router/upstream/request_key.h"

#include <sys/random.h>

#include <array>
#include <cerrno>
#include <cstdint>
#include <random>

namespace baton {
namespace {

constexpr size_t kKeyBytes = kRequestKeyHexDigits / 2;

// The kernel's random bytes; false when it cannot give them (no getrandom, an error).
bool KernelRandom(std::array<uint8_t, kKeyBytes>* out) {
  size_t got = 0;
  while (got < out->size()) {
    const ssize_t n = ::getrandom(out->data() + got, out->size() - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    got += static_cast<size_t>(n);
  }
  return true;
}

void GeneratorRandom(std::array<uint8_t, kKeyBytes>* out) {
  thread_local std::mt19937_64 generator = [] {
    std::random_device device;
    std::seed_seq seed{device(), device(), device(), device(),
                       device(), device(), device(), device()};
    return std::mt19937_64(seed);
  }();
  for (size_t i = 0; i < out->size(); i += 8) {
    uint64_t word = generator();
    for (size_t b = 0; b < 8; ++b, word >>= 8) (*out)[i + b] = static_cast<uint8_t>(word);
  }
}

}  // namespace

std::string NewRequestKey() {
  std::array<uint8_t, kKeyBytes> bytes{};
  if (!KernelRandom(&bytes)) GeneratorRandom(&bytes);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string key;
  key.reserve(kRequestKeyHexDigits);
  for (uint8_t b : bytes) {
    key += kHex[b >> 4];
    key += kHex[b & 0xF];
  }
  return key;
}

bool IsRequestKey(std::string_view key) {
  if (key.size() != kRequestKeyHexDigits) return false;
  for (char c : key) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace baton
