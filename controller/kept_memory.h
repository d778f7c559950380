// Kept memory: what the controller leaves with baton-keeper (controller/keeper/) so that its
// successor adopts the weights and the pool instead of loading the model again, and how the
// successor proves that what it finds is complete and is the configured model's.
//
// Two items are kept: "weights" (the arena memfd, with a WeightManifest written after the
// load finished and the arena was sealed: weightcache/weight_manifest.h) and "pool" (the pool
// memfd, with a PoolManifest of its geometry). Each manifest carries a random generation; the
// controller writes both generations to <state_dir>/memory.json once the keeper holds them
// (MemoryRecord, fsynced). A successor adopts an item only when the keeper's manifest names the
// generation the record names, its checks pass (the model files unchanged, the same geometry,
// the memfd's size and seals) and the memfd is what the manifest describes; anything else is
// refused with the reason and made afresh. Plain values and functions; thread-compatible.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "base/status.h"

namespace baton {

struct PoolManifest {
  static constexpr int kFormat = 1;
  uint32_t block_count = 0;
  uint64_t block_bytes = 0;
  uint64_t bytes = 0;  // the memfd's size
  bool huge_pages = false;
  uint64_t generation = 0;
  bool operator==(const PoolManifest&) const = default;
};
std::string EncodePoolManifest(const PoolManifest& m);
Result<PoolManifest> DecodePoolManifest(const std::string& text, const std::string& where);
// Why a kept pool cannot serve a controller configured with this geometry ("" if it can).
std::string PoolMismatch(const PoolManifest& kept, uint32_t block_count, uint64_t block_bytes,
                         uint64_t memfd_bytes);

struct MemoryRecord {
  uint64_t weights_generation = 0;
  uint64_t pool_generation = 0;
  bool operator==(const MemoryRecord&) const = default;
};
Status SaveMemoryRecord(const std::string& path, const MemoryRecord& record);
// nullopt when there is none; InvalidArgument naming the file when it does not parse.
Result<std::optional<MemoryRecord>> LoadMemoryRecord(const std::string& path);

// 64 random bits (getrandom), never 0.
Result<uint64_t> NewGeneration();

}  // namespace baton
