// CRC32C (Castagnoli, reflected polynomial 0x82F63B78): the checksum of every frame payload.
//
// Same parameters as iSCSI, ext4 and leveldb's crc32c: init 0xFFFFFFFF, reflected input and
// output, final xor 0xFFFFFFFF; Crc32c("123456789") == 0xE3069283. Crc32cExtend() continues a
// checksum over data that arrives in pieces. Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace baton::proto {

// The CRC32C of `size` bytes at `data`.
uint32_t Crc32c(const void* data, size_t size);
inline uint32_t Crc32c(std::string_view bytes) { return Crc32c(bytes.data(), bytes.size()); }

// The CRC32C of (the bytes that gave `crc`) followed by `size` bytes at `data`.
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size);

}  // namespace baton::proto
