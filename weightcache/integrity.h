// Integrity: per-tensor XXH3-64 hashes of a weight cache, and the manifest that records them.
//
// The manifest is `baton-integrity.json` in the model directory:
//   {"algorithm": "xxh3_64", "tensors": {"<name>": "<16 lower-case hex digits>", ...}}
// `baton-weights hash DIR` writes it once from a trusted copy; `baton-weights verify DIR`
// (or a controller at load time) recomputes the hashes from the arena and lists every tensor
// that differs, is missing from the cache, or is not in the manifest. Hashing reads the
// arena only and may use several threads; the functions are thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "weightcache/weight_cache.h"

namespace baton {

inline constexpr char kIntegrityManifestName[] = "baton-integrity.json";
inline constexpr char kIntegrityAlgorithm[] = "xxh3_64";

struct IntegrityManifest {
  std::string algorithm = kIntegrityAlgorithm;
  std::map<std::string, uint64_t> tensors;  // name -> hash
};

struct IntegrityReport {
  std::vector<std::string> mismatched;  // in both, hashes differ
  std::vector<std::string> missing;     // in the manifest, not in the cache
  std::vector<std::string> unexpected;  // in the cache, not in the manifest
  size_t checked = 0;                   // tensors compared
  bool ok() const { return mismatched.empty() && missing.empty() && unexpected.empty(); }
  // One line: "ok: N tensors" or the lists, names included.
  std::string Summary() const;
};

// XXH3-64 of every tensor of the cache, using up to `threads` threads (0: all CPUs).
IntegrityManifest HashTensors(const WeightCache& cache, unsigned threads = 0);

// "0123456789abcdef" form of a hash, and back (nullopt-like failure as an error Status).
std::string HashToHex(uint64_t hash);
Result<uint64_t> HexToHash(std::string_view hex);

// The manifest as JSON text, and parsed from JSON text (`name` appears in error messages).
std::string ManifestToJson(const IntegrityManifest& manifest);
Result<IntegrityManifest> ManifestFromJson(std::string_view name, std::string_view json);

// <dir>/baton-integrity.json: written atomically (temporary file, fsync, rename).
Status WriteManifest(const std::string& dir, const IntegrityManifest& manifest);
Result<IntegrityManifest> ReadManifest(const std::string& dir);

// Compares freshly computed hashes with a manifest.
IntegrityReport CompareManifests(const IntegrityManifest& expected,
                                 const IntegrityManifest& actual);
// Hashes the cache and compares it with `expected`.
IntegrityReport Verify(const WeightCache& cache, const IntegrityManifest& expected,
                       unsigned threads = 0);

}  // namespace baton
