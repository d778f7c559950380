#include "base/failpoint.h"

#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <string>

#include "base/mutex.h"

namespace baton {
namespace {

struct Points {
  Mutex mu;
  std::map<std::string, int> fire_at BATON_GUARDED_BY(mu);  // name -> the hit that fires it
  std::map<std::string, bool> stall BATON_GUARDED_BY(mu);   // name -> stalls rather than dies
  std::map<std::string, int> hits BATON_GUARDED_BY(mu);
};

Points& Get() {
  static Points* points = new Points;
  return *points;
}

void Load() {
  Points& p = Get();
  MutexLock lock(p.mu);
  p.fire_at.clear();
  p.stall.clear();
  p.hits.clear();
  const char* env = std::getenv("BATON_FAILPOINTS");
  const std::string spec = env != nullptr ? env : "";
  size_t start = 0;
  while (start < spec.size()) {
    size_t end = spec.find(',', start);
    if (end == std::string::npos) end = spec.size();
    std::string item = spec.substr(start, end - start);
    int at = 1;
    const std::string suffix = ":stall";  // "name:stall" or "name:N:stall"
    const bool stall = item.size() > suffix.size() &&
                       item.compare(item.size() - suffix.size(), suffix.size(), suffix) == 0;
    if (stall) item.resize(item.size() - suffix.size());
    if (const size_t colon = item.find(':'); colon != std::string::npos) {
      at = std::max(1, std::atoi(item.c_str() + colon + 1));
      item.resize(colon);
    }
    if (!item.empty()) {
      p.fire_at[item] = at;
      p.stall[item] = stall;
    }
    start = end + 1;
  }
  failpoint_internal::enabled.store(!p.fire_at.empty());
}

// Set before main() runs: a daemon reads its failpoints once, from its start.
const bool kLoaded = (Load(), true);

}  // namespace

namespace failpoint_internal {

std::atomic<bool> enabled{false};

void Hit(const char* name) {
  Points& p = Get();
  int hit = 0;
  bool fire = false;
  bool stall = false;
  {
    MutexLock lock(p.mu);
    hit = ++p.hits[name];
    auto it = p.fire_at.find(name);
    fire = it != p.fire_at.end() && it->second == hit;
    stall = fire && p.stall[name];
  }
  if (!fire) return;
  const std::string line = std::string("failpoint ") + name +
                           (stall ? ": stalling this thread" : ": dying here") + " (hit " +
                           std::to_string(hit) + ")\n";
  ssize_t unused = ::write(STDERR_FILENO, line.data(), line.size());
  (void)unused;
  if (!stall) ::raise(SIGKILL);
  while (true) ::pause();  // woken by a handled signal: stalls again
}

}  // namespace failpoint_internal

void ReloadFailpointsForTesting() { Load(); }

int FailpointHits(const char* name) {
  Points& p = Get();
  MutexLock lock(p.mu);
  auto it = p.hits.find(name);
  return it == p.hits.end() ? 0 : it->second;
}

}  // namespace baton
