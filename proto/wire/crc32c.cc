#include "proto/wire/crc32c.h"

#include <boost/crc.hpp>

namespace baton::proto {
namespace {

// Castagnoli polynomial (normal form 0x1EDC6F41), reflected in and out.
using Crc32cEngine = boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true>;

uint32_t Reflect32(uint32_t v) {
  uint32_t r = 0;
  for (int i = 0; i < 32; ++i) r |= ((v >> i) & 1u) << (31 - i);
  return r;
}

}  // namespace

uint32_t Crc32c(const void* data, size_t size) {
  Crc32cEngine engine;
  engine.process_bytes(data, size);
  return engine.checksum();
}

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size) {
  // checksum() is REFLECT(interim remainder) ^ final xor; recover the remainder to resume.
  Crc32cEngine engine(Reflect32(crc ^ 0xFFFFFFFFu));
  engine.process_bytes(data, size);
  return engine.checksum();
}

}  // namespace baton::proto
