// SafetensorsIndex: the validated header of one .safetensors file.
//
// A safetensors file is an 8-byte little-endian header length N, N bytes of JSON header,
// then the data section. Parsing validates the file to the letter of the format and refuses
// anything else; every refusal is an InvalidArgument whose message names the file, the
// tensor (where one is involved) and the rule broken, e.g.
//   "model.safetensors: tensor 'a.weight': data_offsets [0, 10) hold 10 bytes but shape
//    [2, 3] of F32 needs 24 (rule: byte range equals element count x dtype size)".
// Rules: header length at most kMaxHeaderSize and inside the file; header is JSON beginning
// with '{' and is an object; each tensor entry is an object with exactly dtype, shape,
// data_offsets; dtype is known; shape is an array of non-negative integers; data_offsets is
// two integers begin <= end; element count x dtype size equals end - begin, with overflow
// checked; ranges sorted by begin are contiguous from 0 (no gap, no overlap); the last range
// ends exactly at the end of the file; no duplicate tensor names; __metadata__, if present,
// is an object of string values.
// The index is a plain value: no file handle is kept. Thread-compatible.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "weightcache/dtype.h"

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

class SafetensorsIndex {
 public:
  static constexpr uint64_t kMaxHeaderSize = 100'000'000;

  // Reads and validates the header of the file at `path` (the data is not read).
  static Result<SafetensorsIndex> ParseFile(const std::string& path);

  // Validates a whole file held in memory; `name` is used in messages. Used by the fuzzer
  // and by tests; ParseFile shares the same rules.
  static Result<SafetensorsIndex> ParseBuffer(std::string_view name, const uint8_t* data,
                                              size_t size);

  // Validates a header given its JSON bytes and the total file size.
  static Result<SafetensorsIndex> ParseHeader(std::string_view name, std::string_view json,
                                              uint64_t file_size);

  const std::string& path() const { return path_; }
  uint64_t header_size() const { return header_size_; }          // N
  uint64_t data_offset() const { return 8 + header_size_; }      // first data byte in file
  uint64_t file_size() const { return file_size_; }
  uint64_t data_size() const { return file_size_ - data_offset(); }
  // Tensors sorted by begin offset.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // nullptr when absent.
  const TensorInfo* Find(std::string_view name) const;

 private:
  std::string path_;
  uint64_t header_size_ = 0;
  uint64_t file_size_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace baton
