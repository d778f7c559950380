// WeightManifest: everything needed to rebuild a WeightCache over an existing arena memfd
// without reading a byte of the model files, for a controller that takes over the arena its
// crashed or replaced predecessor left with baton-keeper (WeightCache::Adopt).
//
// It records the model directory (as configured and canonical), the identity of every file the
// load read (FileIdentity: size, mtime, inode, device; the index first when one was read), the
// names of the model files the directory held, the tensor table, the arena memfd's size,
// identity (inode, device), page kind, NUMA placement and seal, the load's stats, a 64-bit
// generation chosen by the writer (random, so that a manifest and the memfd kept with it can be
// matched up) and whether the load was complete. EncodeWeightManifest() writes it as one JSON
// object (format 1, below); DecodeWeightManifest() refuses anything malformed with InvalidArgument
// naming the field. CheckManifestMatches() tells whether the model directory is still the one the
// manifest describes, with stat and readdir only. Plain values and functions; thread-safe.
//
//   {"format":1, "generation":"<16 hex digits>", "complete":true,
//    "model_dir":"models/llama", "canonical_model_dir":"/srv/models/llama",
//    "files":[{"name":"model.safetensors","size":N,"mtime_ns":N,"inode":N,"device":N}, ...],
//    "dir_entries":["model.safetensors", ...],
//    "arena":{"size":N,"inode":N,"device":N,"huge_pages":true,"numa_node":0,
//             "numa_bound":true,"numa_source":"local cpu","sealed_read_only":true},
//    "load":{"method":"io_uring+O_DIRECT","fallback_reason":"","bytes":N,"seconds":S,"gbps":G},
//    "tensors":[{"name":"lm_head.weight","dtype":"BF16","shape":[32000,4096],"offset":N,
//                "size":N}, ...]}
//
// The generation is a hex string because JSON tools (jq) read numbers as doubles. Paths and
// names that are not UTF-8 are written with U+FFFD in their place; such a manifest never
// matches its directory, and the model is loaded again.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/status.h"
#include "weightcache/file_identity.h"
#include "weightcache/io/uring_loader.h"
#include "weightcache/safetensors/dtype.h"

namespace baton {

struct CachedTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // in the arena
  uint64_t size = 0;    // bytes
  bool operator==(const CachedTensor&) const = default;
};

inline constexpr size_t kMaxWeightManifestBytes = size_t{64} << 20;

struct WeightManifest {
  static constexpr int kFormat = 1;
  int format = kFormat;
  uint64_t generation = 0;
  bool complete = false;  // the load finished and the arena was sealed as recorded

  std::string model_dir;                 // as configured
  std::string canonical_model_dir;       // realpath of model_dir at load
  std::vector<FileIdentity> files;       // every file the load read
  std::vector<std::string> dir_entries;  // ListModelEntries(model_dir) at load, sorted

  std::vector<CachedTensor> tensors;  // sorted by name
  uint64_t arena_size = 0;
  uint64_t arena_inode = 0;  // the memfd's (fstat), so that another memfd is told apart
  uint64_t arena_device = 0;
  bool huge_pages = false;  // of the first memfd
  // A partial arena (PinnedArena): the size of its first (hugetlb) memfd, a multiple of 2 MiB
  // below arena_size, and the identity of its second (4 KiB pages). 0 for an arena of one
  // memfd (and in manifests made before partial arenas).
  uint64_t arena_first_size = 0;
  uint64_t arena_second_inode = 0;
  uint64_t arena_second_device = 0;
  int numa_node = 0;
  bool numa_bound = false;
  std::string numa_source;
  bool sealed_read_only = false;
  LoadStats load;

  bool operator==(const WeightManifest&) const = default;
};

std::string EncodeWeightManifest(const WeightManifest& manifest);
// `where` names the text in refusals ("the kept weights' manifest").
Result<WeightManifest> DecodeWeightManifest(const std::string& text, const std::string& where);

// Parses JSON `text`, refusing a key repeated within one object (nlohmann would keep the
// last) and invalid JSON, each with `where` and the field in the message.
Result<nlohmann::json> ParseJsonStrict(const std::string& text, const std::string& where);

// OK when `model_dir` is still the directory `manifest` was made from: complete, the same
// canonical path, every listed file with the same size, mtime, inode and device (stat only),
// and the same *.safetensors names and index in the directory (readdir only). Otherwise
// FailedPrecondition naming the first difference, e.g. "model.safetensors changed since the
// arena was loaded (size 1234 -> 1240)".
Status CheckManifestMatches(const WeightManifest& manifest, const std::string& model_dir);

}  // namespace baton
