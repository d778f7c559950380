// Test helpers that write safetensors files: RawSafetensors() frames any header text (with
// any length field) for malformed cases, ValidSafetensors() lays out a well-formed file from
// tensor specs, MalformedSafetensorsCases() is the catalogue of malformed files with the rule
// each breaks (shared by the unit tests and the fuzz seed corpus), and TempDir is a mkdtemp
// directory removed with its contents on destruction. Header-only; single-threaded use.
#pragma once

#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "weightcache/safetensors/dtype.h"

namespace baton::testutil {

// The byte at data offset i of every file written here, so loaders can check contents.
inline uint8_t PatternByte(uint64_t i) { return static_cast<uint8_t>(i * 31 + 7); }

// An 8-byte little-endian length (`length`, or header.size() when absent), the header text,
// then `data_size` data bytes following PatternByte.
inline std::string RawSafetensors(std::string_view header, uint64_t data_size,
                                  std::optional<uint64_t> length = std::nullopt) {
  const uint64_t n = length.value_or(header.size());
  std::string out;
  for (int i = 0; i < 8; ++i) out += static_cast<char>((n >> (8 * i)) & 0xff);
  out += header;
  for (uint64_t i = 0; i < data_size; ++i) out += static_cast<char>(PatternByte(i));
  return out;
}

struct TestTensor {
  std::string name;
  std::string dtype;  // a known dtype name
  std::vector<int64_t> shape;
};

// The header JSON of `tensors` laid out back to back in the given order; `*data_size` gets
// the size of the data section. `pad` trailing spaces are appended.
inline std::string ValidHeader(const std::vector<TestTensor>& tensors,
                               const std::map<std::string, std::string>& metadata,
                               uint64_t* data_size, size_t pad = 0) {
  std::string h = "{";
  if (!metadata.empty()) {
    h += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata) {
      h += (first ? "\"" : ",\"") + k + "\":\"" + v + "\"";
      first = false;
    }
    h += "}";
  }
  uint64_t offset = 0;
  for (const TestTensor& t : tensors) {
    auto dtype = ParseDType(t.dtype);
    if (!dtype) throw std::invalid_argument("ValidHeader: unknown dtype " + t.dtype);
    uint64_t bytes = DTypeSize(*dtype);
    std::string shape;
    for (int64_t d : t.shape) {
      bytes *= static_cast<uint64_t>(d);
      shape += (shape.empty() ? "" : ",") + std::to_string(d);
    }
    if (h.size() > 1) h += ",";
    h += "\"" + t.name + "\":{\"dtype\":\"" + t.dtype + "\",\"shape\":[" + shape +
         "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + bytes) +
         "]}";
    offset += bytes;
  }
  h += "}";
  h.append(pad, ' ');
  *data_size = offset;
  return h;
}

// A complete valid file.
inline std::string ValidSafetensors(const std::vector<TestTensor>& tensors,
                                    const std::map<std::string, std::string>& metadata = {},
                                    size_t pad = 0) {
  uint64_t data_size = 0;
  std::string header = ValidHeader(tensors, metadata, &data_size, pad);
  return RawSafetensors(header, data_size);
}

struct MalformedCase {
  std::string file;    // a file name for the case, e.g. "bad_dtype.safetensors"
  std::string bytes;   // the whole file
  std::string rule;    // the rule name the refusal must cite
  std::string tensor;  // the tensor the refusal must name; empty for a file-level rule
};

inline std::vector<MalformedCase> MalformedSafetensorsCases() {
  const std::string a8 = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  auto entry = [](std::string_view name, std::string_view body) {
    return "{\"" + std::string(name) + "\":" + std::string(body) + "}";
  };
  std::string deep = "{\"a\":";
  for (int i = 0; i < 20; ++i) deep += "[";
  for (int i = 0; i < 20; ++i) deep += "]";
  deep += "}";
  return {
      {"short_file.safetensors", std::string("\x02\x00\x00", 3), "header-length-field", ""},
      {"header_length_limit.safetensors", RawSafetensors("{}", 0, 100'000'001),
       "header-length-limit", ""},
      {"header_past_eof.safetensors", RawSafetensors("{}", 0, 1000), "header-inside-file", ""},
      {"empty_header.safetensors", RawSafetensors("", 0), "header-begins-with-brace", ""},
      {"header_array.safetensors", RawSafetensors("[1]", 0), "header-begins-with-brace", ""},
      {"header_leading_space.safetensors", RawSafetensors(" {}", 0), "header-begins-with-brace",
       ""},
      {"bad_json.safetensors", RawSafetensors(R"({"a": })", 0), "header-json", ""},
      {"unterminated_json.safetensors", RawSafetensors(R"({"a": {"dtype")", 0), "header-json", ""},
      {"invalid_utf8.safetensors", RawSafetensors("{\"\xff\xfe\":{}}", 0), "header-json", ""},
      {"trailing_garbage.safetensors", RawSafetensors("{}  x", 0), "header-padding", ""},
      {"newline_padding.safetensors", RawSafetensors("{}\n", 0), "header-padding", ""},
      {"nul_padding.safetensors", RawSafetensors(std::string("{}\0\0", 4), 0), "header-padding",
       ""},
      {"deep_nesting.safetensors", RawSafetensors(deep, 0), "header-nesting", ""},
      {"duplicate_tensor.safetensors",
       RawSafetensors(
           "{" + a8 + "," + R"("a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]})" + "}", 16),
       "duplicate-key", "a"},
      {"duplicate_field.safetensors",
       RawSafetensors(entry("w", R"({"dtype":"F32","dtype":"I32","shape":[2],)"
                                 R"("data_offsets":[0,8]})"),
                      8),
       "duplicate-key", "w"},
      {"duplicate_metadata_key.safetensors",
       RawSafetensors(R"({"__metadata__":{"k":"1","k":"2"}})", 0), "duplicate-key", ""},
      {"entry_not_object.safetensors", RawSafetensors(R"({"w":5})", 0), "entry-object", "w"},
      {"missing_field.safetensors", RawSafetensors(entry("w", R"({"dtype":"F32","shape":[2]})"), 8),
       "entry-fields", "w"},
      {"unknown_field.safetensors",
       RawSafetensors(entry("w", R"({"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1})"), 8),
       "entry-fields", "w"},
      {"bad_dtype.safetensors",
       RawSafetensors(entry("w", R"({"dtype":"F128","shape":[2],"data_offsets":[0,8]})"), 8),
       "dtype-known", "w"},
      {"dtype_not_string.safetensors",
       RawSafetensors(entry("w", R"({"dtype":4,"shape":[2],"data_offsets":[0,8]})"), 8),
       "dtype-known", "w"},
      {"negative_dim.safetensors",
       RawSafetensors(entry("w", R"({"dtype":"F32","shape":[-2],"data_offsets":[0,8]})"), 8),
       "shape-integers", "w"},
      {"float_dim.safetensors",
       RawSafetensors(entry("w", R"({"dtype":"F32","shape":[2.0],"data_offsets":[0,8]})"), 8),
       "shape-integers", "w"},
      {"shape_not_array.safetensors",
       RawSafetensors(entry("w", R"({"dtype":"F32","shape":"2","data_offsets":[0,8]})"), 8),
       "shape-integers", "w"},
      {"dim_past_int64.safetensors",
       RawSafetensors(entry("w", R"({"dtype":"U8","shape":[9223372036854775808],)"
                                 R"("data_offsets":[0,8]})"),
                      8),
       "shape-integers", "w"},
      {"offsets_single.safetensors",
       RawSafetensors(entry("w", R"({"dtype":"F32","shape":[2],"data_offsets":[8]})"), 8),
       "offsets-pair", "w"},
      {"offsets_negative.safetensors",
       RawSafetensors(entry("w", R"({"dtype":"F32","shape":[2],"data_offsets":[-8,0]})"), 8),
       "offsets-pair", "w"},
      {"offsets_reversed.safetensors",
       RawSafetensors(entry("w", R"({"dtype":"F32","shape":[0],"data_offsets":[8,0]})"), 8),
       "offsets-pair", "w"},
      {"offsets_past_uint64.safetensors",
       RawSafetensors(entry("w", R"({"dtype":"F32","shape":[2],)"
                                 R"("data_offsets":[0,18446744073709551616]})"),
                      8),
       "offsets-pair", "w"},
      {"element_count_overflow.safetensors",
       RawSafetensors(entry("w", R"({"dtype":"U8","shape":[4294967296,4294967296],)"
                                 R"("data_offsets":[0,0]})"),
                      0),
       "size-overflow", "w"},
      {"byte_size_overflow.safetensors",
       RawSafetensors(entry("w", R"({"dtype":"F64","shape":[4611686018427387904],)"
                                 R"("data_offsets":[0,0]})"),
                      0),
       "size-overflow", "w"},
      {"byte_range_mismatch.safetensors",
       RawSafetensors(entry("w", R"({"dtype":"F32","shape":[2,3],"data_offsets":[0,10]})"), 10),
       "byte-range-matches-shape", "w"},
      {"data_past_eof.safetensors",
       RawSafetensors(entry("w", R"({"dtype":"F32","shape":[6],"data_offsets":[0,24]})"), 16),
       "data-inside-file", "w"},
      {"first_range_not_at_zero.safetensors",
       RawSafetensors(entry("w", R"({"dtype":"F32","shape":[2],"data_offsets":[4,12]})"), 12),
       "ranges-contiguous", "w"},
      {"gap.safetensors",
       RawSafetensors(
           "{" + a8 + "," + R"("b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]})" + "}", 20),
       "ranges-contiguous", "b"},
      {"overlap.safetensors",
       RawSafetensors(
           "{" + a8 + "," + R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]})" + "}", 12),
       "ranges-no-overlap", "b"},
      {"zero_size_inside_range.safetensors",
       RawSafetensors(
           "{" + a8 + "," + R"("z":{"dtype":"F32","shape":[0],"data_offsets":[4,4]})" + "}", 8),
       "ranges-no-overlap", "z"},
      {"trailing_data.safetensors", RawSafetensors("{" + a8 + "}", 12), "data-ends-at-file-end",
       ""},
      {"no_tensors_with_data.safetensors", RawSafetensors("{}", 4), "data-ends-at-file-end", ""},
      {"metadata_not_string.safetensors", RawSafetensors(R"({"__metadata__":{"k":1}})", 0),
       "metadata-strings", ""},
      {"metadata_not_object.safetensors", RawSafetensors(R"({"__metadata__":["k"]})", 0),
       "metadata-strings", ""},
  };
}

// A fresh directory from mkdtemp, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir() {
    const char* base = getenv("TMPDIR");
    std::string templ = std::string(base && *base ? base : "/tmp") + "/baton-test-XXXXXX";
    if (mkdtemp(templ.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = templ;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }

  // Writes `bytes` to `name` inside the directory; returns the full path.
  std::string Write(const std::string& name, std::string_view bytes) const {
    std::string full = path_ + "/" + name;
    std::ofstream out(full, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) throw std::runtime_error("cannot write " + full);
    return full;
  }

 private:
  std::string path_;
};

}  // namespace baton::testutil
