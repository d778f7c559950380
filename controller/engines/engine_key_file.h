// EngineKeyFile: the keys the controller gives each engine it launches, in BATON_ENGINE_KEYS,
// from `[engine] key_file` (proto/http/engine_key.h; docs/operations.md, The engine key).
//
// Load() reads the file once at start: a file that cannot be read then stops the start. The
// file is read again at each launch (ForLaunch), so that a key added for a rotation reaches
// the next engine without a controller restart. A file that cannot be read at a launch
// (removed, broken) leaves the keys read last, with a WARN: a launch, often a failover's next
// standby, is never held up by it. One INFO line when the keys change.
//
// Thread-compatible (the controller's io thread).
#pragma once

#include <string>
#include <vector>

#include "base/status.h"

namespace baton {

class EngineKeyFile {
 public:
  explicit EngineKeyFile(std::string path) : path_(std::move(path)) {}

  // Reads the keys; FailedPrecondition naming the file when it holds none. OK without a file.
  Status Load();
  // The keys joined with commas (BATON_ENGINE_KEYS' value); "" without a file.
  std::string ForLaunch();

  const std::string& path() const { return path_; }
  size_t keys() const { return keys_.size(); }

 private:
  const std::string path_;
  std::vector<std::string> keys_;
};

}  // namespace baton
