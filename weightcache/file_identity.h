// FileIdentity: what stat(2) says about one model file, so that a later look can tell whether
// the file is still the one whose bytes were read, without reading a byte of it.
//
// The weight cache stats every file it reads (shards, and the index when it reads one) right
// after validating them, checks them again once the load is done, and records them in its
// WeightManifest; a controller that adopts a kept arena compares them with the files as they
// are now. A file counts as the same when its size, mtime (ns), inode and device are.
// Contents rewritten in place with the same size and a restored mtime are not seen: that takes
// a deliberate utimensat(2), which no download or copy tool does.
// Names are plain file names inside the model directory (no '/'). Plain values and functions;
// thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace baton {

struct FileIdentity {
  std::string name;  // inside the model directory
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  uint64_t inode = 0;
  uint64_t device = 0;
  bool operator==(const FileIdentity&) const = default;
};

// The identity of `dir`/`name` now (stat, symlinks followed).
Result<FileIdentity> StatFileIdentity(const std::string& dir, const std::string& name);

// The first of `files` (in `dir`) that is not what it was, as "NAME changed WHEN (size 1234 ->
// 1240)" or "NAME is gone WHEN (stat: No such file or directory)" with `when` such as "since
// the arena was loaded"; empty when none changed. Only stats.
std::string FirstChangedFile(const std::string& dir, const std::vector<FileIdentity>& files,
                             std::string_view when);

// The names in `dir` that decide what a model directory holds: every `*.safetensors` and
// `model.safetensors.index.json`, sorted. Only reads the directory (readdir), no file in it.
Result<std::vector<std::string>> ListModelEntries(const std::string& dir);

// The first name added to or removed from `was` in `now` (both sorted), as "NAME was added to
// DIR WHEN" / "NAME was removed from DIR WHEN"; empty when they are equal.
std::string FirstChangedEntry(const std::vector<std::string>& was,
                              const std::vector<std::string>& now, const std::string& dir,
                              std::string_view when);

// realpath(3) of `dir`.
Result<std::string> CanonicalPath(const std::string& dir);

// A plain file name: not empty, not "." or "..", no '/' and no NUL.
bool IsPlainFileName(std::string_view name);

}  // namespace baton
