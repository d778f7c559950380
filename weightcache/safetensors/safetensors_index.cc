#include "weightcache/safetensors/safetensors_index.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <tuple>

#include "base/io/unique_fd.h"
#include "weightcache/safetensors/safetensors_json.h"

namespace baton {
namespace {

using Json = nlohmann::json;

constexpr size_t kLengthFieldSize = 8;
constexpr std::string_view kMetadataKey = "__metadata__";

uint64_t LoadLe64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// A JSON value in a message: compact, printable and short.
std::string Describe(const Json& v) {
  switch (v.type()) {
    case Json::value_t::object:
      return "an object";
    case Json::value_t::array:
      return "an array of " + std::to_string(v.size()) + " values";
    case Json::value_t::null:
      return "null";
    case Json::value_t::string:
      return "the string \"" + PrintableName(v.get_ref<const std::string&>()) + "\"";
    default:
      return PrintableName(v.dump());
  }
}

std::string Range(uint64_t begin, uint64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + ")";
}

// A non-negative JSON integer no greater than `max` ("-0" counts as 0); nullopt otherwise.
std::optional<uint64_t> NonNegativeInteger(const Json& v, uint64_t max) {
  if (v.is_number_unsigned()) {
    const uint64_t x = v.get<uint64_t>();
    if (x <= max) return x;
  } else if (v.is_number_integer() && v.get<int64_t>() == 0) {
    return 0;
  }
  return std::nullopt;
}

Status CheckFields(std::string_view file, const std::string& name, const Json& entry) {
  constexpr std::string_view kFields[] = {"dtype", "shape", "data_offsets"};
  for (const auto& [key, value] : entry.items()) {
    if (std::find(std::begin(kFields), std::end(kFields), key) == std::end(kFields)) {
      return SafetensorsTensorError(file, name,
                                    "unknown field '" + PrintableName(key) +
                                        "'; an entry has exactly dtype, shape and "
                                        "data_offsets",
                                    "entry-fields");
    }
  }
  for (std::string_view field : kFields) {
    if (!entry.contains(field)) {
      return SafetensorsTensorError(file, name, "missing field '" + std::string(field) + "'",
                                    "entry-fields");
    }
  }
  return OkStatus();
}

Status ParseShape(std::string_view file, const std::string& name, const Json& shape,
                  TensorInfo* t) {
  constexpr std::string_view kRule = "shape-integers";
  if (!shape.is_array()) {
    return SafetensorsTensorError(file, name, "shape is " + Describe(shape) + ", not an array",
                                  kRule);
  }
  t->shape.reserve(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) {
    auto dim = NonNegativeInteger(shape[i], std::numeric_limits<int64_t>::max());
    if (!dim) {
      return SafetensorsTensorError(file, name,
                                    "shape[" + std::to_string(i) + "] is " + Describe(shape[i]) +
                                        ", not a non-negative 64-bit integer",
                                    kRule);
    }
    t->shape.push_back(static_cast<int64_t>(*dim));
  }
  return OkStatus();
}

Status ParseOffsets(std::string_view file, const std::string& name, const Json& offsets,
                    TensorInfo* t) {
  constexpr std::string_view kRule = "offsets-pair";
  if (!offsets.is_array() || offsets.size() != 2) {
    return SafetensorsTensorError(
        file, name, "data_offsets is " + Describe(offsets) + ", not a pair [begin, end]", kRule);
  }
  const uint64_t kMax = std::numeric_limits<uint64_t>::max();
  auto begin = NonNegativeInteger(offsets[0], kMax);
  auto end = NonNegativeInteger(offsets[1], kMax);
  if (!begin || !end) {
    return SafetensorsTensorError(file, name,
                                  "data_offsets [" + Describe(offsets[0]) + ", " +
                                      Describe(offsets[1]) +
                                      "] are not non-negative 64-bit integers",
                                  kRule);
  }
  if (*begin > *end) {
    return SafetensorsTensorError(
        file, name,
        "data_offsets begin " + std::to_string(*begin) + " is past end " + std::to_string(*end),
        kRule);
  }
  t->begin = *begin;
  t->end = *end;
  return OkStatus();
}

Status CheckByteRange(std::string_view file, const TensorInfo& t, uint64_t data_size) {
  uint64_t count = 1;
  for (int64_t dim : t.shape) {
    if (__builtin_mul_overflow(count, static_cast<uint64_t>(dim), &count)) {
      return SafetensorsTensorError(file, t.name, "element count of the shape overflows 64 bits",
                                    "size-overflow");
    }
  }
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(count, static_cast<uint64_t>(DTypeSize(t.dtype)), &bytes)) {
    return SafetensorsTensorError(file, t.name,
                                  std::to_string(count) + " elements of " +
                                      std::string(DTypeName(t.dtype)) +
                                      " overflow 64 bits of bytes",
                                  "size-overflow");
  }
  if (t.size() != bytes) {
    return SafetensorsTensorError(
        file, t.name,
        "data_offsets " + Range(t.begin, t.end) + " hold " + std::to_string(t.size()) +
            " bytes but " + std::to_string(count) + " elements of " +
            std::string(DTypeName(t.dtype)) + " need " + std::to_string(bytes),
        "byte-range-matches-shape");
  }
  if (t.end > data_size) {
    return SafetensorsTensorError(file, t.name,
                                  "data_offsets " + Range(t.begin, t.end) +
                                      " run past the data section of " + std::to_string(data_size) +
                                      " bytes",
                                  "data-inside-file");
  }
  return OkStatus();
}

Status ParseEntry(std::string_view file, const std::string& name, const Json& entry,
                  uint64_t data_size, TensorInfo* t) {
  t->name = name;
  if (!entry.is_object()) {
    return SafetensorsTensorError(file, name, "entry is " + Describe(entry) + ", not an object",
                                  "entry-object");
  }
  BATON_RETURN_IF_ERROR(CheckFields(file, name, entry));
  const Json& dtype = entry["dtype"];
  if (!dtype.is_string()) {
    return SafetensorsTensorError(file, name, "dtype is " + Describe(dtype) + ", not a string",
                                  "dtype-known");
  }
  const std::optional<DType> parsed = ParseDType(dtype.get_ref<const std::string&>());
  if (!parsed) {
    return SafetensorsTensorError(
        file, name,
        "dtype \"" + PrintableName(dtype.get_ref<const std::string&>()) +
            "\" is not one of F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL F8_E4M3 F8_E5M2",
        "dtype-known");
  }
  t->dtype = *parsed;
  BATON_RETURN_IF_ERROR(ParseShape(file, name, entry["shape"], t));
  BATON_RETURN_IF_ERROR(ParseOffsets(file, name, entry["data_offsets"], t));
  return CheckByteRange(file, *t, data_size);
}

Status ParseMetadata(std::string_view file, const Json& metadata,
                     std::map<std::string, std::string>* out) {
  constexpr std::string_view kRule = "metadata-strings";
  if (!metadata.is_object()) {
    return SafetensorsFileError(file, "__metadata__ is " + Describe(metadata) + ", not an object",
                                kRule);
  }
  for (const auto& [key, value] : metadata.items()) {
    if (!value.is_string()) {
      return SafetensorsFileError(file,
                                  "__metadata__ key '" + PrintableName(key) + "' holds " +
                                      Describe(value) + ", not a string",
                                  kRule);
    }
    out->emplace(key, value.get<std::string>());
  }
  return OkStatus();
}

// Ranges sorted by begin must tile the data section: from 0, no gap, no overlap, to its end.
Status CheckTiling(std::string_view file, const std::vector<TensorInfo>& tensors,
                   uint64_t data_size) {
  uint64_t expected = 0;
  const TensorInfo* prev = nullptr;
  for (const TensorInfo& t : tensors) {
    if (t.begin > expected) {
      std::string what = prev == nullptr
                             ? "the first range " + Range(t.begin, t.end) + " does not begin at 0"
                             : "range " + Range(t.begin, t.end) + " leaves a gap of " +
                                   std::to_string(t.begin - expected) + " bytes after tensor '" +
                                   PrintableName(prev->name) + "' " + Range(prev->begin, prev->end);
      return SafetensorsTensorError(file, t.name, what, "ranges-contiguous");
    }
    if (t.begin < expected) {
      return SafetensorsTensorError(file, t.name,
                                    "range " + Range(t.begin, t.end) + " overlaps tensor '" +
                                        PrintableName(prev->name) + "' " +
                                        Range(prev->begin, prev->end),
                                    "ranges-no-overlap");
    }
    expected = t.end;
    prev = &t;
  }
  if (expected != data_size) {
    return SafetensorsFileError(file,
                                "tensors end at data byte " + std::to_string(expected) +
                                    " but the data section holds " + std::to_string(data_size) +
                                    " bytes",
                                "data-ends-at-file-end");
  }
  return OkStatus();
}

// The 8-byte field said `n`; the file is `file_size` >= 8 bytes.
Status CheckHeaderLength(std::string_view file, uint64_t n, uint64_t file_size) {
  if (n > SafetensorsIndex::kMaxHeaderSize) {
    return SafetensorsFileError(file,
                                "header length " + std::to_string(n) + " exceeds the limit of " +
                                    std::to_string(SafetensorsIndex::kMaxHeaderSize) + " bytes",
                                "header-length-limit");
  }
  if (n > file_size - kLengthFieldSize) {
    return SafetensorsFileError(file,
                                "header length " + std::to_string(n) +
                                    " runs past the end of the file of " +
                                    std::to_string(file_size) + " bytes",
                                "header-inside-file");
  }
  return OkStatus();
}

Status CheckLengthField(std::string_view file, uint64_t file_size) {
  if (file_size < kLengthFieldSize) {
    return SafetensorsFileError(file,
                                "file of " + std::to_string(file_size) +
                                    " bytes is shorter than the 8-byte header length field",
                                "header-length-field");
  }
  return OkStatus();
}

Status PreadFull(int fd, const std::string& path, void* buf, size_t size, uint64_t offset) {
  auto* p = static_cast<uint8_t*>(buf);
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::pread(fd, p + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(path + ": read", errno);
    }
    if (n == 0) {
      return Status(StatusCode::kIoError, path + ": read: file ended at byte " +
                                              std::to_string(offset + done) + ", before the " +
                                              std::to_string(size) + " bytes expected at offset " +
                                              std::to_string(offset));
    }
    done += static_cast<size_t>(n);
  }
  return OkStatus();
}

}  // namespace

std::string PrintableName(std::string_view s, size_t max_bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  const size_t n = std::min(s.size(), max_bytes);
  out.reserve(n + 8);
  for (size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 0xf];
    }
  }
  if (s.size() > n) out += "...";
  return out;
}

Status SafetensorsFileError(std::string_view file, std::string_view what, std::string_view rule) {
  std::string msg(file);
  msg += ": ";
  msg += what;
  msg += " (rule: ";
  msg += rule;
  msg += ")";
  return InvalidArgument(std::move(msg));
}

Status SafetensorsTensorError(std::string_view file, std::string_view tensor, std::string_view what,
                              std::string_view rule) {
  std::string msg = "tensor '" + PrintableName(tensor) + "': ";
  msg += what;
  return SafetensorsFileError(file, msg, rule);
}

uint64_t TensorInfo::element_count() const {
  uint64_t count = 1;
  for (int64_t dim : shape) count *= static_cast<uint64_t>(dim);
  return count;
}

Result<SafetensorsIndex> SafetensorsIndex::ParseFile(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (!fd) return ErrnoStatus(path + ": open", errno);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(path + ": fstat", errno);
  if (!S_ISREG(st.st_mode)) return InvalidArgument(path + ": not a regular file");
  const auto file_size = static_cast<uint64_t>(st.st_size);
  BATON_RETURN_IF_ERROR(CheckLengthField(path, file_size));
  uint8_t field[kLengthFieldSize];
  BATON_RETURN_IF_ERROR(PreadFull(fd.get(), path, field, sizeof(field), 0));
  const uint64_t n = LoadLe64(field);
  BATON_RETURN_IF_ERROR(CheckHeaderLength(path, n, file_size));
  std::string header(n, '\0');
  BATON_RETURN_IF_ERROR(PreadFull(fd.get(), path, header.data(), n, kLengthFieldSize));
  return ParseHeader(path, header, file_size);
}

Result<SafetensorsIndex> SafetensorsIndex::ParseBuffer(std::string_view name, const uint8_t* data,
                                                       size_t size) {
  BATON_RETURN_IF_ERROR(CheckLengthField(name, size));
  const uint64_t n = LoadLe64(data);
  BATON_RETURN_IF_ERROR(CheckHeaderLength(name, n, size));
  std::string_view header(reinterpret_cast<const char*>(data) + kLengthFieldSize, n);
  return ParseHeader(name, header, size);
}

Result<SafetensorsIndex> SafetensorsIndex::ParseHeader(std::string_view name, std::string_view json,
                                                       uint64_t file_size) {
  BATON_RETURN_IF_ERROR(CheckLengthField(name, file_size));
  const uint64_t header_size = json.size();
  BATON_RETURN_IF_ERROR(CheckHeaderLength(name, header_size, file_size));
  Json root;
  BATON_RETURN_IF_ERROR(ParseSafetensorsHeaderJson(name, json, &root));

  SafetensorsIndex index;
  index.path_ = std::string(name);
  index.header_size_ = header_size;
  index.file_size_ = file_size;
  const uint64_t data_size = index.data_size();
  index.tensors_.reserve(root.size());
  for (const auto& [key, value] : root.items()) {
    if (key == kMetadataKey) {
      BATON_RETURN_IF_ERROR(ParseMetadata(name, value, &index.metadata_));
      continue;
    }
    TensorInfo t;
    BATON_RETURN_IF_ERROR(ParseEntry(name, key, value, data_size, &t));
    index.tensors_.push_back(std::move(t));
  }
  std::sort(index.tensors_.begin(), index.tensors_.end(),
            [](const TensorInfo& a, const TensorInfo& b) {
              return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
            });
  BATON_RETURN_IF_ERROR(CheckTiling(name, index.tensors_, data_size));
  return index;
}

const TensorInfo* SafetensorsIndex::Find(std::string_view name) const {
  for (const TensorInfo& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

}  // namespace baton
