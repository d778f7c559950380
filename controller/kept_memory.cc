#include "controller/kept_memory.h"

#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <nlohmann/json.hpp>

#include "base/io/small_file.h"
#include "base/text/json_field.h"

namespace baton {
namespace {

using nlohmann::json;
constexpr size_t kMaxRecordBytes = 4096;

}  // namespace

std::string EncodePoolManifest(const PoolManifest& m) {
  return json{{"format", PoolManifest::kFormat}, {"block_count", m.block_count},
              {"block_bytes", m.block_bytes},    {"bytes", m.bytes},
              {"huge_pages", m.huge_pages},      {"generation", m.generation}}
      .dump();
}

Result<PoolManifest> DecodePoolManifest(const std::string& text, const std::string& where) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return InvalidArgument(where + ": not a JSON object");
  int format = 0;
  BATON_RETURN_IF_ERROR(JsonField(j, "format", where, &format));
  if (format != PoolManifest::kFormat) {
    return InvalidArgument(where + ": format " + std::to_string(format) + ", this build reads " +
                           std::to_string(PoolManifest::kFormat));
  }
  PoolManifest m;
  BATON_RETURN_IF_ERROR(JsonField(j, "block_count", where, &m.block_count));
  BATON_RETURN_IF_ERROR(JsonField(j, "block_bytes", where, &m.block_bytes));
  BATON_RETURN_IF_ERROR(JsonField(j, "bytes", where, &m.bytes));
  BATON_RETURN_IF_ERROR(JsonField(j, "huge_pages", where, &m.huge_pages));
  BATON_RETURN_IF_ERROR(JsonField(j, "generation", where, &m.generation));
  return m;
}

std::string PoolMismatch(const PoolManifest& kept, uint32_t block_count, uint64_t block_bytes,
                         uint64_t memfd_bytes) {
  if (kept.block_count != block_count || kept.block_bytes != block_bytes) {
    return "the kept pool is " + std::to_string(kept.block_count) + " blocks of " +
           std::to_string(kept.block_bytes) + " bytes, the configuration wants " +
           std::to_string(block_count) + " of " + std::to_string(block_bytes);
  }
  if (memfd_bytes != kept.bytes || memfd_bytes < uint64_t{block_count} * block_bytes) {
    return "the kept pool's memfd holds " + std::to_string(memfd_bytes) + " bytes, its manifest " +
           std::to_string(kept.bytes);
  }
  return "";
}

Status SaveMemoryRecord(const std::string& path, const MemoryRecord& r) {
  return WriteFileAtomically(path, json{{"weights_generation", r.weights_generation},
                                        {"pool_generation", r.pool_generation}}
                                           .dump() +
                                       "\n");
}

Result<std::optional<MemoryRecord>> LoadMemoryRecord(const std::string& path) {
  if (::access(path.c_str(), F_OK) != 0 && errno == ENOENT) return std::optional<MemoryRecord>();
  BATON_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(path, kMaxRecordBytes));
  if (text.size() > kMaxRecordBytes) return InvalidArgument(path + ": too large");
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return InvalidArgument(path + ": not a JSON object");
  MemoryRecord r;
  BATON_RETURN_IF_ERROR(JsonField(j, "weights_generation", path, &r.weights_generation));
  BATON_RETURN_IF_ERROR(JsonField(j, "pool_generation", path, &r.pool_generation));
  return std::optional<MemoryRecord>(r);
}

Result<uint64_t> NewGeneration() {
  uint64_t g = 0;
  while (g == 0) {
    const ssize_t n = ::getrandom(&g, sizeof(g), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n != static_cast<ssize_t>(sizeof(g))) return ErrnoStatus("getrandom", errno);
  }
  return g;
}

}  // namespace baton
