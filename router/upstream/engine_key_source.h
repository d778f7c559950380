// EngineKeySource: the engine key a router sends engines, `Authorization: Bearer KEY` with the
// first key of its engine_key_file (proto/http/engine_key.h; docs/router.md, The engine key).
//
// Load() reads the file: at start (an error stops the start) and again on SIGHUP (an error
// keeps the key it had). A router without a file sends no key.
//
// Thread-safe: Header() is read by every attempt on any io thread while Load() may run.
#pragma once

#include <string>

#include "base/mutex.h"
#include "base/status.h"

namespace baton {

class EngineKeySource {
 public:
  explicit EngineKeySource(std::string path) : path_(std::move(path)) {}

  // Reads the file's first key; FailedPrecondition naming the file (and keeping the key it
  // had) when it holds none. OK without a file.
  Status Load();
  // "Bearer KEY", or "" without a file.
  std::string Header() const;
  const std::string& path() const { return path_; }

 private:
  const std::string path_;
  mutable Mutex mu_;
  std::string header_ BATON_GUARDED_BY(mu_);
};

}  // namespace baton
