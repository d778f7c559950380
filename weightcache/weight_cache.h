// WeightCache: one model's tensors resident in a PinnedArena, with the table that says
// where each tensor lives, ready to be shared with engines by fd.
//
// Load() validates the model directory (ModelFiles), sizes and creates the arena, and fills
// it with UringLoader. Each file's data section is placed at a 4096-aligned arena offset
// plus the data section's own misalignment within its first page, so O_DIRECT reads go
// straight from the file into the arena; tensor offsets in the table are absolute arena
// offsets. The cache is immutable once loaded: its memfd is then sealed read-only, so
// engines can map it read-only and in no other way. Move-only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "weightcache/io/pinned_arena.h"
#include "weightcache/io/uring_loader.h"
#include "weightcache/model_files.h"
#include "weightcache/safetensors/dtype.h"

namespace baton {

struct CachedTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // in the arena
  uint64_t size = 0;    // bytes
};

struct WeightCacheOptions {
  ArenaOptions arena;  // size is computed by Load()
  LoadOptions load;
};

class WeightCache {
 public:
  static Result<WeightCache> Load(const std::string& dir, WeightCacheOptions options);

  const std::string& dir() const { return dir_; }
  // Sorted by name.
  const std::vector<CachedTensor>& tensors() const { return tensors_; }
  const CachedTensor* Find(const std::string& name) const;
  const uint8_t* TensorData(const CachedTensor& t) const { return arena_.data() + t.offset; }
  uint64_t tensor_bytes() const;
  const PinnedArena& arena() const { return arena_; }
  const LoadStats& load_stats() const { return stats_; }

 private:
  std::string dir_;
  PinnedArena arena_;
  std::vector<CachedTensor> tensors_;
  LoadStats stats_;
};

}  // namespace baton
