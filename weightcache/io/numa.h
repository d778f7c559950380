// NUMA helpers for the weight cache: which node to bind to, and binding a mapping to it.
//
// The node is chosen in order: an explicit request; the node the kernel reports for the
// GPU's PCI device (<sysfs>/bus/pci/devices/<bus id>/numa_node); the node of the CPU the
// caller runs on. The sysfs root is a parameter so that tests can point it at a fake tree.
// Plain functions, no state; thread-safe.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace baton {

inline constexpr std::string_view kDefaultSysfsRoot = "/sys";

struct NumaChoice {
  int node = 0;
  std::string source;   // "config", "gpu 0000:17:00.0", "local cpu"
  std::string warning;  // set when a GPU was named but its node could not be read
};

// Resolves the node as described above. Never fails: a GPU whose node is unknown (no such
// device, or the kernel reports -1 as it does on single-node machines) falls back to the
// local node with a warning.
NumaChoice ResolveNumaNode(int requested, const std::string& gpu_pci_bus_id,
                           std::string_view sysfs_root = kDefaultSysfsRoot);

// Canonical sysfs form "dddd:bb:dd.f" (lower case, 4-digit domain) of a PCI bus id given as
// "bb:dd.f", "dddd:bb:dd.f" or nvidia-smi's "dddddddd:bb:dd.f"; nullopt if malformed.
std::optional<std::string> NormalizePciBusId(std::string_view id);

// The nodes listed in <sysfs>/devices/system/node/online ("0-1,3" form); {0} when the file
// is missing (a kernel without NUMA).
std::vector<int> OnlineNumaNodes(std::string_view sysfs_root = kDefaultSysfsRoot);

// Parses a kernel cpulist/nodelist such as "0-3,8,10-11"; nullopt if malformed.
std::optional<std::vector<int>> ParseNodeList(std::string_view text);

// The node of the CPU the calling thread runs on (0 when unknown).
int CurrentNumaNode();

// Sets an MPOL_BIND policy for [addr, addr+size) to `node`. Pages touched afterwards are
// allocated there; pages already present are moved where the kernel can.
Status BindMemoryToNode(void* addr, size_t size, int node);

// The node that holds the (already faulted) page at `addr`.
Result<int> NodeOfAddress(const void* addr);

}  // namespace baton
