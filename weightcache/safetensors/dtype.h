// DType: the element types of the safetensors format and their sizes.
//
// Names are the format's own ("F32", "BF16", ...). Values are stable: they cross process
// boundaries in the tensor table (proto/messages.h carries them as uint8_t).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace baton {

enum class DType : uint8_t {
  kF64 = 1,
  kF32,
  kF16,
  kBF16,
  kI64,
  kI32,
  kI16,
  kI8,
  kU8,
  kBool,
  kF8E4M3,
  kF8E5M2,
};

// Bytes per element; 0 for a value that names no DType.
size_t DTypeSize(DType dtype);
// The safetensors name, e.g. "BF16"; "INVALID" for a value that names no DType.
std::string_view DTypeName(DType dtype);
// Parses a safetensors dtype name; nullopt for an unknown one.
std::optional<DType> ParseDType(std::string_view name);
// True for a value that names a DType (for data read off the wire).
bool IsValidDType(uint8_t value);

}  // namespace baton
