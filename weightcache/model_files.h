// ModelFiles: the safetensors files that make up one model directory.
//
// A directory holds either one `model.safetensors`, or shards listed by
// `model.safetensors.index.json` ({"metadata": {...}, "weight_map": {tensor: file}}), or,
// with neither, every `*.safetensors` file in it (sorted by name). Where both
// `model.safetensors` and an index exist, `model.safetensors` is the model (as in
// transformers). Opening validates every shard (SafetensorsIndex) and, with an index, that
// each mapped tensor is in the file the map names, that every tensor of every shard is
// mapped, that the file names stay inside the directory, and that no tensor appears in two
// shards. Refusals name the file, the tensor and the rule, in SafetensorsIndex's shapes; the
// rules beyond SafetensorsIndex's:
//   index-json             the index is valid JSON, nested at most 16 levels, at most 100 MB
//   index-weight-map       it is an object with a "weight_map" object of tensor -> file name
//                          strings ("metadata", if present, is an object)
//   duplicate-key          no key twice in one object of the index (a tensor mapped twice)
//   shard-name             each file name is a plain name inside the directory (no '/', not
//                          "." or "..")
//   shard-file             each named shard can be opened and read
//   tensor-in-named-shard  each mapped tensor is in the shard the map names
//   tensor-unmapped        each tensor of each shard is in weight_map
//   tensor-in-two-shards   no tensor is in two shards (with or without an index)
// Thread-compatible value; copies and moves keep Find() valid.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "weightcache/safetensors/safetensors_index.h"

namespace baton {

class ModelFiles {
 public:
  static Result<ModelFiles> Open(const std::string& dir);

  ModelFiles() = default;  // no shards
  ModelFiles(const ModelFiles& other);
  ModelFiles& operator=(const ModelFiles& other);
  ModelFiles(ModelFiles&&) = default;
  ModelFiles& operator=(ModelFiles&&) = default;

  const std::string& dir() const { return dir_; }
  // The index file that was read (model.safetensors.index.json); empty when none was.
  const std::string& index_path() const { return index_path_; }
  const std::vector<SafetensorsIndex>& shards() const { return shards_; }
  uint64_t total_file_bytes() const;
  uint64_t total_tensor_bytes() const;
  size_t tensor_count() const { return locations_.size(); }

  struct Location {
    size_t shard;  // index into shards()
    const TensorInfo* tensor;
  };
  // nullptr when absent.
  const Location* Find(const std::string& name) const;

 private:
  Status AddShard(const std::string& name);
  Status OpenIndexed(const std::string& index_path);
  Status BuildLocations();
  void Reindex(const ModelFiles& other);

  std::string dir_;
  std::string index_path_;
  std::vector<SafetensorsIndex> shards_;
  std::unordered_map<std::string, Location> locations_;
};

}  // namespace baton
