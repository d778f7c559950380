// What this process has mapped, read from /proc/self/maps: for tests that check which parts
// of the pool range an engine session maps writable (fencing rule 5). Header-only.
#pragma once

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

namespace baton::testing {

// Permissions of this process's mappings that overlap [lo, hi), e.g. {"---p", "rw-s"}.
inline std::vector<std::string> MappingsIn(const void* lo_ptr, uint64_t bytes) {
  const auto lo = reinterpret_cast<uintptr_t>(lo_ptr);
  const uintptr_t hi = lo + bytes;
  std::ifstream maps("/proc/self/maps");
  std::vector<std::string> perms;
  std::string line;
  while (std::getline(maps, line)) {
    unsigned long long a = 0, b = 0;
    char p[8] = {};
    if (std::sscanf(line.c_str(), "%llx-%llx %7s", &a, &b, p) != 3) continue;
    if (a < hi && lo < b) perms.push_back(p);
  }
  return perms;
}

inline bool AnyWritable(const std::vector<std::string>& perms) {
  for (const std::string& p : perms) {
    if (p[1] == 'w') return true;
  }
  return false;
}

// True when every mapping in [lo, lo + bytes) is writable (and there is one).
inline bool AllWritable(const std::vector<std::string>& perms) {
  if (perms.empty()) return false;
  for (const std::string& p : perms) {
    if (p[1] != 'w') return false;
  }
  return true;
}

}  // namespace baton::testing
