#include "weightcache/safetensors/dtype.h"

#include <array>

namespace baton {
namespace {

struct DTypeEntry {
  DType dtype;
  std::string_view name;
  size_t size;
};

constexpr std::array<DTypeEntry, 12> kDTypes = {{
    {DType::kF64, "F64", 8},
    {DType::kF32, "F32", 4},
    {DType::kF16, "F16", 2},
    {DType::kBF16, "BF16", 2},
    {DType::kI64, "I64", 8},
    {DType::kI32, "I32", 4},
    {DType::kI16, "I16", 2},
    {DType::kI8, "I8", 1},
    {DType::kU8, "U8", 1},
    {DType::kBool, "BOOL", 1},
    {DType::kF8E4M3, "F8_E4M3", 1},
    {DType::kF8E5M2, "F8_E5M2", 1},
}};

const DTypeEntry* Lookup(DType dtype) {
  for (const auto& e : kDTypes)
    if (e.dtype == dtype) return &e;
  return nullptr;
}

}  // namespace

size_t DTypeSize(DType dtype) {
  const DTypeEntry* e = Lookup(dtype);
  return e ? e->size : 0;
}

std::string_view DTypeName(DType dtype) {
  const DTypeEntry* e = Lookup(dtype);
  return e ? e->name : std::string_view("INVALID");
}

std::optional<DType> ParseDType(std::string_view name) {
  for (const auto& e : kDTypes)
    if (e.name == name) return e.dtype;
  return std::nullopt;
}

bool IsValidDType(uint8_t value) {
  return value >= static_cast<uint8_t>(DType::kF64) &&
         value <= static_cast<uint8_t>(DType::kF8E5M2);
}

}  // namespace baton
