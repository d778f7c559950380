// WriteModel: writes a deterministic synthetic Llama-style model (config.json and
// safetensors shards, with model.safetensors.index.json when sharded) into a directory.
//
// The same spec (seed included) always produces byte-identical files. Data is generated in
// large blocks by `threads` threads while a writer thread issues big write() calls, so a
// multi-GB model takes seconds. Each file is written under a temporary name and renamed into
// place; model files of an earlier model in the directory are removed first (only of a model
// baton-mkmodel wrote: a directory holding another model is refused, FailedPrecondition), and
// config.json is renamed in last, so a directory with config.json holds a complete model. The
// caller owns the directory; one WriteModel per directory at a time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "standby/mkmodel/model_layout.h"
#include "standby/mkmodel/model_presets.h"

namespace baton {

struct WriteOptions {
  int threads = 2;     // generator threads (a separate thread writes)
  bool sync = false;   // fsync every file and the directory before returning
  bool reuse = false;  // keep the directory's model when it already matches the spec
};

struct ModelSummary {
  std::string dir;
  std::vector<std::string> files;  // names inside dir, config.json and index included
  size_t tensor_count = 0;
  uint64_t tensor_bytes = 0;  // the sum of tensor sizes (the index's total_size)
  uint64_t file_bytes = 0;    // the safetensors files' sizes
  double seconds = 0;
  bool reused = false;  // true when reuse was asked and nothing had to be written
};

Result<ModelSummary> WriteModel(const ModelSpec& spec, const std::string& dir);
Result<ModelSummary> WriteModel(const ModelSpec& spec, const std::string& dir,
                                const WriteOptions& options);

// OK when `dir` holds the files that WriteModel would write for `layout`: the same
// config.json and index, and every shard with the expected size and header bytes (the data
// itself is not read). Otherwise FailedPrecondition naming the first difference.
Status CheckWrittenModel(const ModelLayout& layout, const std::string& dir);

}  // namespace baton
