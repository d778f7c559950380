#include "router/upstream/engine_key_source.h"

#include <vector>

#include "proto/http/engine_key.h"

namespace baton {

Status EngineKeySource::Load() {
  if (path_.empty()) return OkStatus();
  BATON_ASSIGN_OR_RETURN(std::vector<std::string> keys, ReadEngineKeyFile(path_));
  MutexLock lock(mu_);
  header_ = "Bearer " + keys.front();
  return OkStatus();
}

std::string EngineKeySource::Header() const {
  MutexLock lock(mu_);
  return header_;
}

}  // namespace baton
