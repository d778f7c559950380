// ModelFiles: the safetensors files that make up one model directory.
//
// A directory holds either one `model.safetensors`, or shards listed by
// `model.safetensors.index.json` ({"metadata": {...}, "weight_map": {tensor: file}}), or,
// with neither, every `*.safetensors` file in it (sorted by name). Opening validates every
// shard (SafetensorsIndex) and, with an index, that each mapped tensor is in the file the
// map names, that every tensor of every shard is mapped, that the file names stay inside
// the directory, and that no tensor appears in two shards. Refusals name the file, the
// tensor and the rule. Thread-compatible value.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "weightcache/safetensors_index.h"

namespace baton {

class ModelFiles {
 public:
  static Result<ModelFiles> Open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const std::vector<SafetensorsIndex>& shards() const { return shards_; }
  uint64_t total_file_bytes() const;
  uint64_t total_tensor_bytes() const;
  size_t tensor_count() const { return locations_.size(); }

  struct Location {
    size_t shard;         // index into shards()
    const TensorInfo* tensor;
  };
  // nullptr when absent.
  const Location* Find(const std::string& name) const;

 private:
  std::string dir_;
  std::vector<SafetensorsIndex> shards_;
  std::unordered_map<std::string, Location> locations_;
};

}  // namespace baton
