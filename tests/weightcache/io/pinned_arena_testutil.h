// Helpers shared by the PinnedArena tests.
#pragma once

#include <linux/capability.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "weightcache/io/pinned_arena.h"

namespace baton::arena_testing {

// HugePages_Free of /proc/meminfo (0 when absent).
inline long HugePagesFree() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  long value = 0;
  while (in >> key >> value) {
    if (key == "HugePages_Free:") return value;
    in.ignore(256, '\n');
  }
  return 0;
}

// True when one of the arena's warnings contains `text`.
inline bool AnyWarningContains(const PinnedArena& arena, const std::string& text) {
  for (const std::string& w : arena.warnings()) {
    if (w.find(text) != std::string::npos) return true;
  }
  return false;
}

// Drops CAP_IPC_LOCK from this thread's effective set; false when capset refuses.
inline bool DropIpcLock() {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2]{};
  if (::syscall(SYS_capget, &header, data) != 0) return false;
  data[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
  return ::syscall(SYS_capset, &header, data) == 0;
}

}  // namespace baton::arena_testing
