// LoggedKeys: which version of each key a periodic reading of an etcd prefix has already
// logged as refused, so that a key that stays bad is logged once per version, and only the
// keys of the last reading are kept (keys of nodes or routers long gone are forgotten).
//
// A reading calls First() for each key it refuses, then EndReading(). Header-only;
// thread-compatible (one reading thread).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>

namespace baton {

class LoggedKeys {
 public:
  // Whether `key` at `mod_revision` is to be logged now: the last reading did not log it at
  // that revision. Remembered for this reading.
  bool First(const std::string& key, int64_t mod_revision) {
    current_[key] = mod_revision;
    auto logged = last_.find(key);
    return logged == last_.end() || logged->second != mod_revision;
  }
  // Ends a reading: the keys it did not refuse are forgotten.
  void EndReading() { last_ = std::exchange(current_, {}); }

 private:
  std::map<std::string, int64_t> last_;     // the last reading's refused keys
  std::map<std::string, int64_t> current_;  // this reading's so far
};

}  // namespace baton
