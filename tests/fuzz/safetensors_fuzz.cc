// libFuzzer target for the safetensors parser: ParseBuffer on the input as a whole file, and
// ParseHeader on the input as a bare JSON header. Whatever parses must satisfy the
// invariants the rest of Baton relies on; a violation aborts.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "weightcache/safetensors/safetensors_index.h"

namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

void CheckIndex(const baton::SafetensorsIndex& index) {
  Check(index.header_size() <= baton::SafetensorsIndex::kMaxHeaderSize);
  Check(index.data_offset() <= index.file_size());
  uint64_t expected = 0;
  for (const baton::TensorInfo& t : index.tensors()) {
    Check(baton::IsValidDType(static_cast<uint8_t>(t.dtype)));
    Check(t.begin == expected && t.begin <= t.end && t.end <= index.data_size());
    uint64_t bytes = baton::DTypeSize(t.dtype);
    for (int64_t dim : t.shape) {
      Check(dim >= 0);
      Check(!__builtin_mul_overflow(bytes, static_cast<uint64_t>(dim), &bytes));
    }
    Check(bytes == t.size());
    Check(t.element_count() * baton::DTypeSize(t.dtype) == t.size());
    const baton::TensorInfo* found = index.Find(t.name);
    Check(found != nullptr && found->name == t.name);
    expected = t.end;
  }
  Check(expected == index.data_size());
}

void CheckRefusal(const baton::Status& status, std::string_view name) {
  Check(!status.ok());
  const std::string& m = status.message();
  Check(m.compare(0, name.size(), name) == 0);
  Check(m.find("(rule: ") != std::string::npos && m.back() == ')');
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr std::string_view kName = "fuzz.safetensors";
  auto file = baton::SafetensorsIndex::ParseBuffer(kName, data, size);
  if (file.ok()) {
    Check(file->file_size() == size);
    CheckIndex(*file);
  } else {
    CheckRefusal(file.status(), kName);
  }
  std::string_view json(reinterpret_cast<const char*>(data), size);
  auto header = baton::SafetensorsIndex::ParseHeader(kName, json, 8 + size);
  if (header.ok()) {
    CheckIndex(*header);
  } else {
    CheckRefusal(header.status(), kName);
  }
  return 0;
}
