#include "weightcache/io/numa.h"

#include <numaif.h>
#include <sched.h>

#include <cctype>
#include <cerrno>
#include <charconv>
#include <fstream>
#include <sstream>

namespace baton {
namespace {

std::optional<std::string> ReadFirstLine(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::string line;
  std::getline(in, line);
  while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
  return line;
}

std::optional<int> ParseInt(std::string_view text) {
  int value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || text.empty()) return std::nullopt;
  return value;
}

bool IsHex(std::string_view text) {
  if (text.empty()) return false;
  for (char c : text) {
    if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

std::string Lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

std::optional<std::string> NormalizePciBusId(std::string_view id) {
  // [domain:]bus:device.function
  const size_t dot = id.rfind('.');
  if (dot == std::string_view::npos) return std::nullopt;
  const std::string_view function = id.substr(dot + 1);
  const std::string_view head = id.substr(0, dot);
  const size_t last_colon = head.rfind(':');
  if (last_colon == std::string_view::npos) return std::nullopt;
  const std::string_view device = head.substr(last_colon + 1);
  const std::string_view rest = head.substr(0, last_colon);
  const size_t first_colon = rest.rfind(':');
  std::string_view bus = rest;
  std::string_view domain = "0000";
  if (first_colon != std::string_view::npos) {
    bus = rest.substr(first_colon + 1);
    domain = rest.substr(0, first_colon);
  }
  if (!IsHex(domain) || !IsHex(bus) || !IsHex(device) || !IsHex(function)) return std::nullopt;
  if (bus.size() != 2 || device.size() != 2 || function.size() != 1) return std::nullopt;
  // nvidia-smi prints an 8-digit domain; sysfs uses 4. Extra leading digits must be zero.
  if (domain.size() > 4) {
    if (domain.substr(0, domain.size() - 4).find_first_not_of('0') != std::string_view::npos) {
      return std::nullopt;
    }
    domain = domain.substr(domain.size() - 4);
  }
  std::string out = std::string(4 - domain.size(), '0') + std::string(domain);
  out += ":" + std::string(bus) + ":" + std::string(device) + "." + std::string(function);
  return Lower(out);
}

std::optional<std::vector<int>> ParseNodeList(std::string_view text) {
  std::vector<int> nodes;
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) {
    text.remove_suffix(1);
  }
  if (text.empty()) return nodes;
  std::stringstream ss{std::string(text)};
  std::string item;
  while (std::getline(ss, item, ',')) {
    const size_t dash = item.find('-');
    auto lo = ParseInt(std::string_view(item).substr(0, dash));
    auto hi = dash == std::string::npos ? lo : ParseInt(std::string_view(item).substr(dash + 1));
    if (!lo || !hi || *lo < 0 || *hi < *lo || *hi > 65535) return std::nullopt;
    for (int n = *lo; n <= *hi; ++n) nodes.push_back(n);
  }
  return nodes;
}

std::vector<int> OnlineNumaNodes(std::string_view sysfs_root) {
  auto line = ReadFirstLine(std::string(sysfs_root) + "/devices/system/node/online");
  if (!line) return {0};
  auto nodes = ParseNodeList(*line);
  if (!nodes || nodes->empty()) return {0};
  return *nodes;
}

int CurrentNumaNode() {
  unsigned cpu = 0;
  unsigned node = 0;
  if (::getcpu(&cpu, &node) != 0) return 0;
  return static_cast<int>(node);
}

NumaChoice ResolveNumaNode(int requested, const std::string& gpu_pci_bus_id,
                           std::string_view sysfs_root) {
  if (requested >= 0) return {requested, "config", ""};
  NumaChoice choice{CurrentNumaNode(), "local cpu", ""};
  if (gpu_pci_bus_id.empty()) return choice;
  auto id = NormalizePciBusId(gpu_pci_bus_id);
  if (!id) {
    choice.warning = "GPU PCI bus id '" + gpu_pci_bus_id +
                     "' is malformed (want dddd:bb:dd.f); using the local NUMA node";
    return choice;
  }
  const std::string path = std::string(sysfs_root) + "/bus/pci/devices/" + *id + "/numa_node";
  auto line = ReadFirstLine(path);
  auto node = line ? ParseInt(*line) : std::nullopt;
  if (!node) {
    choice.warning =
        "cannot read the NUMA node of GPU " + *id + " from " + path + "; using the local NUMA node";
    return choice;
  }
  if (*node < 0) {
    // The kernel reports -1 when the platform does not describe the device's locality.
    choice.source = "local cpu (GPU " + *id + " reports no NUMA node)";
    return choice;
  }
  return {*node, "gpu " + *id, ""};
}

Status BindMemoryToNode(void* addr, size_t size, int node) {
  if (node < 0) return InvalidArgument("NUMA node " + std::to_string(node) + " is negative");
  constexpr size_t kBits = sizeof(unsigned long) * 8;
  std::vector<unsigned long> mask(static_cast<size_t>(node) / kBits + 2, 0);
  mask[static_cast<size_t>(node) / kBits] |= 1ul << (static_cast<size_t>(node) % kBits);
  if (::mbind(addr, size, MPOL_BIND, mask.data(), mask.size() * kBits,
              MPOL_MF_STRICT | MPOL_MF_MOVE) != 0) {
    return ErrnoStatus("mbind to NUMA node " + std::to_string(node), errno);
  }
  return OkStatus();
}

Result<int> NodeOfAddress(const void* addr) {
  int node = -1;
  if (::get_mempolicy(&node, nullptr, 0, const_cast<void*>(addr), MPOL_F_NODE | MPOL_F_ADDR) != 0) {
    return ErrnoStatus("get_mempolicy", errno);
  }
  return node;
}

}  // namespace baton
