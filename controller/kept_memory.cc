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

std::string DevicePartName(const std::string& region, uint32_t part) {
  return std::string(kKeptDeviceName) + "." + region + "." + std::to_string(part);
}

namespace {

json RegionJson(const DeviceRegionManifest& r) {
  return json{{"chunk_bytes", r.chunk_bytes}, {"chunks", r.chunks}, {"parts", r.parts}};
}

Status RegionFromJson(const json& j, const std::string& key, const std::string& where,
                      DeviceRegionManifest* r) {
  const std::string at = where + " " + key;
  if (!j.contains(key) || !j[key].is_object()) return InvalidArgument(at + ": missing");
  BATON_RETURN_IF_ERROR(JsonField(j[key], "chunk_bytes", at, &r->chunk_bytes));
  BATON_RETURN_IF_ERROR(JsonField(j[key], "chunks", at, &r->chunks));
  return JsonField(j[key], "parts", at, &r->parts);
}

Result<json> ParseFormat(const std::string& text, const std::string& where, int want) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return InvalidArgument(where + ": not a JSON object");
  int format = 0;
  BATON_RETURN_IF_ERROR(JsonField(j, "format", where, &format));
  if (format != want) {
    return InvalidArgument(where + ": format " + std::to_string(format) + ", this build reads " +
                           std::to_string(want));
  }
  return j;
}

}  // namespace

std::string EncodeDeviceManifest(const DeviceManifest& m) {
  return json{{"format", DeviceManifest::kFormat},
              {"generation", m.generation},
              {"weights_generation", m.weights_generation},
              {"pool_generation", m.pool_generation},
              {"device", m.device},
              {"pci_bus_id", m.pci_bus_id},
              {"block_count", m.block_count},
              {"block_bytes", m.block_bytes},
              {"weights", RegionJson(m.weights)},
              {"pool", RegionJson(m.pool)}}
      .dump();
}

Result<DeviceManifest> DecodeDeviceManifest(const std::string& text, const std::string& where) {
  BATON_ASSIGN_OR_RETURN(json j, ParseFormat(text, where, DeviceManifest::kFormat));
  DeviceManifest m;
  BATON_RETURN_IF_ERROR(JsonField(j, "generation", where, &m.generation));
  BATON_RETURN_IF_ERROR(JsonField(j, "weights_generation", where, &m.weights_generation));
  BATON_RETURN_IF_ERROR(JsonField(j, "pool_generation", where, &m.pool_generation));
  BATON_RETURN_IF_ERROR(JsonField(j, "device", where, &m.device));
  BATON_RETURN_IF_ERROR(JsonField(j, "pci_bus_id", where, &m.pci_bus_id));
  BATON_RETURN_IF_ERROR(JsonField(j, "block_count", where, &m.block_count));
  BATON_RETURN_IF_ERROR(JsonField(j, "block_bytes", where, &m.block_bytes));
  BATON_RETURN_IF_ERROR(RegionFromJson(j, "weights", where, &m.weights));
  BATON_RETURN_IF_ERROR(RegionFromJson(j, "pool", where, &m.pool));
  return m;
}

std::string DeviceMismatch(const DeviceManifest& kept, const DeviceManifest& now) {
  if (kept.weights_generation != now.weights_generation) {
    return "the kept device weights were copied from other host weights than the adopted ones";
  }
  if (kept.pool_generation != now.pool_generation) {
    return "the kept device pool was kept with another host pool than the adopted one";
  }
  if (kept.device != now.device || kept.pci_bus_id != now.pci_bus_id) {
    return "the kept device memory is on device " + std::to_string(kept.device) + " (" +
           kept.pci_bus_id + "), this controller uses device " + std::to_string(now.device) + " (" +
           now.pci_bus_id + ")";
  }
  if (kept.block_count != now.block_count || kept.block_bytes != now.block_bytes) {
    return "the kept device pool is " + std::to_string(kept.block_count) + " blocks of " +
           std::to_string(kept.block_bytes) + " bytes, the configuration wants " +
           std::to_string(now.block_count) + " of " + std::to_string(now.block_bytes);
  }
  for (const DeviceRegionManifest* r : {&kept.weights, &kept.pool}) {
    const uint64_t parts = (uint64_t{r->chunks} + kDeviceFdsPerPart - 1) / kDeviceFdsPerPart;
    if (r->chunks == 0 || r->chunk_bytes == 0 || r->parts != parts) {
      return "the kept device manifest's chunks and parts do not agree";
    }
  }
  return "";
}

std::string EncodeDevicePartManifest(const DevicePartManifest& m) {
  return json{{"format", DeviceManifest::kFormat},
              {"generation", m.generation},
              {"part", m.part},
              {"first_chunk", m.first_chunk},
              {"chunks", m.chunks}}
      .dump();
}

Result<DevicePartManifest> DecodeDevicePartManifest(const std::string& text,
                                                    const std::string& where) {
  BATON_ASSIGN_OR_RETURN(json j, ParseFormat(text, where, DeviceManifest::kFormat));
  DevicePartManifest m;
  BATON_RETURN_IF_ERROR(JsonField(j, "generation", where, &m.generation));
  BATON_RETURN_IF_ERROR(JsonField(j, "part", where, &m.part));
  BATON_RETURN_IF_ERROR(JsonField(j, "first_chunk", where, &m.first_chunk));
  BATON_RETURN_IF_ERROR(JsonField(j, "chunks", where, &m.chunks));
  return m;
}

Status SaveMemoryRecord(const std::string& path, const MemoryRecord& r) {
  return WriteFileAtomically(path, json{{"weights_generation", r.weights_generation},
                                        {"pool_generation", r.pool_generation},
                                        {"device_generation", r.device_generation}}
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
  if (j.contains("device_generation")) {
    BATON_RETURN_IF_ERROR(JsonField(j, "device_generation", path, &r.device_generation));
  }
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
