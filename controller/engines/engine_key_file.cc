#include "controller/engines/engine_key_file.h"

#include "base/log.h"
#include "proto/http/engine_key.h"

namespace baton {

Status EngineKeyFile::Load() {
  if (path_.empty()) return OkStatus();
  BATON_ASSIGN_OR_RETURN(keys_, ReadEngineKeyFile(path_));
  return OkStatus();
}

std::string EngineKeyFile::ForLaunch() {
  if (path_.empty()) return "";
  Result<std::vector<std::string>> keys = ReadEngineKeyFile(path_);
  if (!keys.ok()) {
    BATON_LOG(WARN, "controller") << keys.status().message() << ": this engine gets the "
                                  << keys_.size() << " keys read before";
  } else if (*keys != keys_) {
    keys_ = std::move(keys).value();
    BATON_LOG(INFO, "controller") << "engine key file " << path_ << " changed: engines launched "
                                  << "from now on take its " << keys_.size() << " keys";
  }
  return JoinEngineKeys(keys_);
}

}  // namespace baton
