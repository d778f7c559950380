// WeightCache: one model's tensors resident in a PinnedArena, with the table that says
// where each tensor lives, ready to be shared with engines by fd.
//
// Load() validates the model directory (ModelFiles), sizes and creates the arena, and fills
// it with UringLoader. Each file's data section is placed at a 4096-aligned arena offset
// plus the data section's own misalignment within its first page, so O_DIRECT reads go
// straight from the file into the arena; tensor offsets in the table are absolute arena
// offsets. The cache is immutable once loaded: its memfd is then sealed read-only, so
// engines can map it read-only and in no other way. Load() stats every file it reads right
// after validating it (FileIdentity) and refuses the load (DataLoss) when one changed by the
// time the load is done.
//
// Manifest() describes a loaded cache (WeightManifest) so that a later controller can take
// its memfd over with Adopt() instead of reading the model again: Adopt() checks the model
// directory against the manifest (CheckManifestMatches: stat and readdir, no read), checks
// the memfd (PinnedArena::Adopt: size, page kind, seals, inode), maps it read-only and
// rebuilds the tensor table from the manifest. Move-only; one thread at a time (the controller's).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "weightcache/file_identity.h"
#include "weightcache/io/pinned_arena.h"
#include "weightcache/io/uring_loader.h"
#include "weightcache/model_files.h"
#include "weightcache/safetensors/dtype.h"
#include "weightcache/weight_manifest.h"

namespace baton {

struct WeightCacheOptions {
  ArenaOptions arena;  // size is computed by Load()
  LoadOptions load;
};

struct AdoptOptions {
  // The configured model directory; it must be the manifest's, unchanged.
  std::string model_dir;
  // false: the directory is not compared with the manifest (the arena is adopted as it was
  // loaded, whatever the files are now: a controller whose model files changed and no longer
  // load serves on from the kept arena). A manifest that is not complete is still refused.
  bool check_files = true;
  // mlock the new mapping, in the arena's background thread (the old controller's lock went
  // with its mapping).
  bool lock = true;
};

class WeightCache {
 public:
  static Result<WeightCache> Load(const std::string& dir, WeightCacheOptions options);
  // Takes over `arena`, the memfd of a cache that `manifest` describes, reading no model file.
  // Refused with FailedPrecondition naming the first thing that differs: the model directory
  // or its files (CheckManifestMatches), the memfd's size, page kind, seals or identity.
  // The tensor table is the manifest's; load_stats() says method "adopted", bytes 0, and how
  // long the adoption took; arena().locked() turns true once the background mlock is done.
  // `arena` holds the cache's memfds in order: one, or two for a partial arena (PinnedArena).
  static Result<WeightCache> Adopt(std::vector<SharedMemory> arena, const WeightManifest& manifest,
                                   const AdoptOptions& options);
  static Result<WeightCache> Adopt(SharedMemory arena, const WeightManifest& manifest,
                                   const AdoptOptions& options) {
    std::vector<SharedMemory> parts;
    parts.push_back(std::move(arena));
    return Adopt(std::move(parts), manifest, options);
  }

  // What Adopt() needs to take this cache's memfd over; complete, with `generation`.
  WeightManifest Manifest(uint64_t generation) const;

  const std::string& dir() const { return dir_; }
  // Sorted by name.
  const std::vector<CachedTensor>& tensors() const { return tensors_; }
  const CachedTensor* Find(const std::string& name) const;
  const uint8_t* TensorData(const CachedTensor& t) const { return arena_.data() + t.offset; }
  uint64_t tensor_bytes() const;
  const PinnedArena& arena() const { return arena_; }
  const LoadStats& load_stats() const { return stats_; }

 private:
  Status NoteSources(const ModelFiles& files);

  std::string dir_;
  std::string canonical_dir_;
  std::vector<FileIdentity> files_;
  std::vector<std::string> dir_entries_;
  PinnedArena arena_;
  std::vector<CachedTensor> tensors_;
  LoadStats stats_;
};

}  // namespace baton
