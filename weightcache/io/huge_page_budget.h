// HugePageBudget: how many 2 MiB huge pages a weight arena of a given size may take.
//
// The arena takes, of the pages it needs, as many as are free both on its NUMA node (sysfs
// free_hugepages; the arena is bound there, so pages free only elsewhere would fail the
// population) and on the machine (HugePages_Free less HugePages_Rsvd: pages another memfd
// already reserved are not free), and no more than a configured cap. Fewer than it needs
// makes a partial arena (PinnedArena): the huge pages it can have, 4 KiB pages for the rest.
// `why` says what limited it. The counts are read once; another process may take pages in
// between, which the reservation at creation then turns into a fallback. Plain functions,
// thread-safe.
#pragma once

#include <cstdint>
#include <string>

namespace baton {

struct HugePageBudget {
  uint64_t needed = 0;  // 2 MiB pages the whole arena would take
  uint64_t pages = 0;   // pages it may take, <= needed
  std::string why;      // what limited `pages` below `needed`; empty when it did not
};

// `max_pages` < 0: no cap. Counts the kernel does not report (no hugetlb, no sysfs node)
// do not limit; the reservation then decides.
HugePageBudget BudgetHugePages(uint64_t arena_bytes, int numa_node, int64_t max_pages,
                               const std::string& sysfs_root);

// A field of /proc/meminfo (e.g. "HugePages_Free"), or -1 when absent.
long MeminfoValue(const std::string& key);

// Free 2 MiB huge pages on `node` (sysfs), or -1 when the kernel does not say.
long FreeHugePagesOnNode(const std::string& sysfs_root, int node);

}  // namespace baton
