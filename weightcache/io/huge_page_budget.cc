#include "weightcache/io/huge_page_budget.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>

#include "proto/transport/shared_memory.h"

namespace baton {

long MeminfoValue(const std::string& key) {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, key.size() + 1, key + ":") == 0) {
      return std::strtol(line.c_str() + key.size() + 1, nullptr, 10);
    }
  }
  return -1;
}

long FreeHugePagesOnNode(const std::string& sysfs_root, int node) {
  std::ifstream in(sysfs_root + "/devices/system/node/node" + std::to_string(node) +
                   "/hugepages/hugepages-2048kB/free_hugepages");
  long value = -1;
  return in >> value ? value : -1;
}

HugePageBudget BudgetHugePages(uint64_t arena_bytes, int numa_node, int64_t max_pages,
                               const std::string& sysfs_root) {
  HugePageBudget b;
  b.needed = (arena_bytes + kHugePageSize - 1) / kHugePageSize;
  b.pages = b.needed;
  const auto limit = [&b](uint64_t pages, const std::string& what) {
    if (pages >= b.pages) return;
    b.pages = pages;
    b.why = what + std::to_string(pages) + " free 2 MiB huge pages of the " +
            std::to_string(b.needed) + " the arena needs";
  };
  if (const long on_node = FreeHugePagesOnNode(sysfs_root, numa_node); on_node >= 0) {
    limit(static_cast<uint64_t>(on_node), "NUMA node " + std::to_string(numa_node) + " has ");
  }
  const long free = MeminfoValue("HugePages_Free");
  const long reserved = std::max(MeminfoValue("HugePages_Rsvd"), 0L);
  if (free >= 0) {
    limit(static_cast<uint64_t>(std::max(free - reserved, 0L)), "the machine has ");
  }
  if (max_pages >= 0 && static_cast<uint64_t>(max_pages) < b.pages) {
    b.pages = static_cast<uint64_t>(max_pages);
    b.why = "the arena may take at most " + std::to_string(max_pages) +
            " huge pages (max_huge_pages) of the " + std::to_string(b.needed) + " it needs";
  }
  return b;
}

}  // namespace baton
