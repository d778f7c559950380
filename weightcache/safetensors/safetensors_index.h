// SafetensorsIndex: the validated header of one .safetensors file.
//
// A safetensors file is an 8-byte little-endian header length N, N bytes of JSON header,
// then the data section. Parsing validates the file to the letter of the format and refuses
// anything else; every refusal is an InvalidArgument whose message names the file, the
// tensor (where one is involved) and the rule broken, in one of two shapes:
//   "<file>: tensor '<name>': <what> (rule: <rule>)"
//   "<file>: <what> (rule: <rule>)"
// e.g. "model.safetensors: tensor 'a.weight': data_offsets [0, 10) hold 10 bytes but 6
//       elements of F32 need 24 (rule: byte-range-matches-shape)".
// The rules, by their stable names:
//   header-length-field       the file holds at least the 8-byte length field
//   header-length-limit       N <= kMaxHeaderSize
//   header-inside-file        8 + N <= file size
//   header-begins-with-brace  the header is non-empty, begins with '{' and is a JSON object
//   header-padding            only spaces (0x20) follow the JSON object inside the N bytes
//   header-json               the header is valid JSON (syntax, UTF-8)
//   header-nesting            JSON nesting is at most 16 levels
//   duplicate-key             no key twice in one object: tensor names, entry fields,
//                             __metadata__ keys
//   entry-object              a tensor's entry is a JSON object
//   entry-fields              it has exactly dtype, shape and data_offsets
//   dtype-known               dtype is one of F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL F8_E4M3
//                             F8_E5M2
//   shape-integers            shape is an array of integers in [0, 2^63)
//   offsets-pair              data_offsets is [begin, end] of integers in [0, 2^64), begin <= end
//   size-overflow             element count x dtype size fits in 64 bits
//   byte-range-matches-shape  end - begin equals element count x dtype size
//   data-inside-file          end lies inside the data section
//   ranges-contiguous         sorted by begin, ranges start at 0 and leave no gap
//   ranges-no-overlap         no range begins before the previous one ends
//   data-ends-at-file-end     the last range ends exactly at the end of the file
//   metadata-strings          __metadata__, if present, is an object of string values
// Zero-size tensors (a dimension of 0, begin == end) are legal, as is a file with no tensors
// and an empty data section.
// The index is a plain value: no file handle is kept. Thread-compatible.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "weightcache/safetensors/dtype.h"

namespace baton {

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offset in the data section
  uint64_t end = 0;    // one past the last byte, in the data section
  uint64_t size() const { return end - begin; }
  uint64_t element_count() const;
};

// Message helpers shared with ModelFiles; they build the two shapes above.
Status SafetensorsFileError(std::string_view file, std::string_view what, std::string_view rule);
Status SafetensorsTensorError(std::string_view file, std::string_view tensor, std::string_view what,
                              std::string_view rule);
// `s` for a message: bytes outside printable ASCII, and '\\', written as \xNN; cut after
// `max_bytes` with "..." appended.
std::string PrintableName(std::string_view s, size_t max_bytes = 200);

class SafetensorsIndex {
 public:
  static constexpr uint64_t kMaxHeaderSize = 100'000'000;

  // Reads and validates the header of the file at `path` (the data is not read). Open and
  // read failures are IoErrors naming the path and errno's text.
  static Result<SafetensorsIndex> ParseFile(const std::string& path);

  // Validates a whole file held in memory; `name` is used in messages. Used by the fuzzer
  // and by tests; ParseFile shares the same rules.
  static Result<SafetensorsIndex> ParseBuffer(std::string_view name, const uint8_t* data,
                                              size_t size);

  // Validates a header given its JSON bytes and the total file size.
  static Result<SafetensorsIndex> ParseHeader(std::string_view name, std::string_view json,
                                              uint64_t file_size);

  const std::string& path() const { return path_; }
  uint64_t header_size() const { return header_size_; }      // N
  uint64_t data_offset() const { return 8 + header_size_; }  // first data byte in file
  uint64_t file_size() const { return file_size_; }
  uint64_t data_size() const { return file_size_ - data_offset(); }
  // Tensors sorted by begin offset.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // nullptr when absent. Linear in the number of tensors.
  const TensorInfo* Find(std::string_view name) const;

 private:
  std::string path_;
  uint64_t header_size_ = 0;
  uint64_t file_size_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace baton
