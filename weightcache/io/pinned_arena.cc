#include "weightcache/io/pinned_arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "base/log.h"
#include "weightcache/io/numa.h"

namespace baton {
namespace {

constexpr char kComponent[] = "arena";

// A field of /proc/meminfo (e.g. "HugePages_Free"), or -1 when absent.
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

std::string MemlockLimitText() {
  struct rlimit lim {};
  if (::getrlimit(RLIMIT_MEMLOCK, &lim) != 0) return "unknown";
  if (lim.rlim_cur == RLIM_INFINITY) return "unlimited";
  return std::to_string(lim.rlim_cur) + " bytes";
}

std::string JoinNodes(const std::vector<int>& nodes) {
  std::string out;
  for (int n : nodes) out += (out.empty() ? "" : ",") + std::to_string(n);
  return out;
}

std::string MlockFailure(size_t size, int err, bool huge_pages) {
  std::ostringstream note;
  note << "mlock of " << size << " bytes failed (" << std::strerror(err) << "; RLIMIT_MEMLOCK is "
       << MemlockLimitText() << "): "
       << (huge_pages ? "huge pages are never swapped, but the memory is not "
                        "accounted as locked"
                      : "the weights may be swapped out")
       << "; raise the limit with `ulimit -l unlimited`, LimitMEMLOCK=infinity in the "
          "systemd unit, or grant CAP_IPC_LOCK";
  return note.str();
}

// Why `memory` lacks the seals `record` says it has; empty when it does not.
std::string SealMismatch(const SharedMemory& memory, const ArenaRecord& record) {
  if (!record.sealed_read_only) return "";
  Result<unsigned> seals = memory.seals();
  if (!seals.ok()) return "the record says sealed read-only, but " + seals.status().message();
  std::string missing;
  for (const auto& [bit, name] :
       {std::pair{F_SEAL_FUTURE_WRITE, "F_SEAL_FUTURE_WRITE"},
        std::pair{F_SEAL_SHRINK, "F_SEAL_SHRINK"}, std::pair{F_SEAL_GROW, "F_SEAL_GROW"}}) {
    if ((*seals & static_cast<unsigned>(bit)) == 0) {
      missing += (missing.empty() ? "" : ", ") + std::string(name);
    }
  }
  if (!missing.empty()) {
    return "the record says sealed read-only, but the memfd lacks the seals " + missing;
  }
  return "";
}

// Why `memory` is not the arena `record` describes; empty when it is.
std::string AdoptMismatch(const SharedMemory& memory, const ArenaRecord& record) {
  if (memory.size() != record.size) {
    return "the memfd holds " + std::to_string(memory.size()) + " bytes, the record says " +
           std::to_string(record.size);
  }
  if (memory.huge_pages() != record.huge_pages) {
    return std::string("the memfd has ") + (memory.huge_pages() ? "2 MiB" : "4 KiB") +
           " pages, the record says " + (record.huge_pages ? "2 MiB" : "4 KiB");
  }
  if (const std::string seals = SealMismatch(memory, record); !seals.empty()) return seals;
  struct stat st {};
  if (::fstat(memory.fd(), &st) != 0) return ErrnoStatus("fstat of the memfd", errno).message();
  if (st.st_ino != record.inode || st.st_dev != record.device) {
    return "the memfd is another object than the recorded one (inode " + std::to_string(st.st_ino) +
           ", recorded " + std::to_string(record.inode) + ")";
  }
  return "";
}

}  // namespace

PinnedArena::~PinnedArena() { background_lock_.reset(); }

Result<PinnedArena> PinnedArena::Adopt(SharedMemory memory, const ArenaRecord& record, bool lock) {
  if (const std::string why = AdoptMismatch(memory, record); !why.empty()) {
    return FailedPrecondition("adopting the weight arena: " + why);
  }
  PinnedArena arena;
  arena.memory_ = std::move(memory);
  BATON_ASSIGN_OR_RETURN(arena.mapping_,
                         arena.memory_.Map(Protection::kReadOnly, /*populate=*/false));
  arena.adopted_ = true;
  arena.numa_node_ = record.numa_node;
  arena.numa_bound_ = record.numa_bound;
  arena.numa_source_ = record.numa_source;
  arena.sealed_read_only_ = record.sealed_read_only;
  if (!record.sealed_read_only) {
    arena.warnings_.push_back(
        "the adopted weights are not sealed read-only (they were not when loaded): an engine "
        "could map them writable");
  }
  if (lock) {
    arena.background_lock_ =
        std::make_unique<BackgroundLock>(arena.mapping_.data(), arena.mapping_.size());
  }
  return arena;
}

std::pair<uint64_t, uint64_t> PinnedArena::identity() const {
  struct stat st {};
  if (::fstat(memory_.fd(), &st) != 0) return {0, 0};
  return {static_cast<uint64_t>(st.st_ino), static_cast<uint64_t>(st.st_dev)};
}

void PinnedArena::AwaitLock() const {
  if (background_lock_) background_lock_->Wait();
}

std::vector<std::string> PinnedArena::warnings() const {
  std::vector<std::string> out = warnings_;
  if (background_lock_ && background_lock_->done() && background_lock_->error() != 0) {
    out.push_back(MlockFailure(size(), background_lock_->error(), huge_pages()));
  }
  return out;
}

int ChooseNumaNode(int requested, const std::string& gpu_pci_bus_id) {
  return ChooseNumaNode(requested, gpu_pci_bus_id, std::string(kDefaultSysfsRoot));
}

int ChooseNumaNode(int requested, const std::string& gpu_pci_bus_id,
                   const std::string& sysfs_root) {
  return ResolveNumaNode(requested, gpu_pci_bus_id, sysfs_root).node;
}

Result<PinnedArena> PinnedArena::Create(const ArenaOptions& options) {
  if (options.size == 0) {
    return InvalidArgument("arena '" + options.name + "': size 0");
  }
  PinnedArena arena;
  BATON_RETURN_IF_ERROR(arena.ChooseNode(options));
  BATON_RETURN_IF_ERROR(arena.MapMemory(options));
  Status bound = BindMemoryToNode(arena.mapping_.data(), arena.mapping_.size(), arena.numa_node_);
  arena.numa_bound_ = bound.ok();
  if (!bound.ok()) {
    arena.warnings_.push_back(bound.message() +
                              ": pages go wherever the kernel puts them (is mbind allowed "
                              "in this container? seccomp and cpusets can forbid it)");
  }
  if (options.populate) BATON_RETURN_IF_ERROR(arena.Populate());
  if (options.lock) arena.Lock();
  for (const std::string& w : arena.warnings_) BATON_LOG(WARN, kComponent) << w;
  BATON_LOG(INFO, kComponent) << "arena '" << options.name << "': " << arena.size()
                              << " bytes, huge_pages=" << arena.huge_pages()
                              << " numa_node=" << arena.numa_node_ << " (" << arena.numa_source_
                              << ") bound=" << arena.numa_bound_
                              << " populated=" << options.populate << " locked=" << arena.locked_;
  return arena;
}

Status PinnedArena::ChooseNode(const ArenaOptions& options) {
  NumaChoice choice =
      ResolveNumaNode(options.numa_node, options.gpu_pci_bus_id, options.sysfs_root);
  const std::vector<int> online = OnlineNumaNodes(options.sysfs_root);
  const bool is_online = std::find(online.begin(), online.end(), choice.node) != online.end();
  if (!is_online && options.numa_node >= 0) {
    return InvalidArgument("NUMA node " + std::to_string(choice.node) +
                           " is not online (online nodes: " + JoinNodes(online) + ")");
  }
  if (!is_online) {
    choice.warning = "NUMA node " + std::to_string(choice.node) + " (from " + choice.source +
                     ") is not online; using node " + std::to_string(online.front());
    choice.node = online.front();
  }
  if (!choice.warning.empty()) warnings_.push_back(choice.warning);
  numa_node_ = choice.node;
  numa_source_ = choice.source;
  return OkStatus();
}

// Free 2 MiB huge pages on `node` (sysfs), or -1 when the kernel does not say.
long FreeHugePagesOnNode(const std::string& sysfs_root, int node) {
  std::ifstream in(sysfs_root + "/devices/system/node/node" + std::to_string(node) +
                   "/hugepages/hugepages-2048kB/free_hugepages");
  long value = -1;
  return in >> value ? value : -1;
}

Status PinnedArena::MapMemory(const ArenaOptions& options) {
  SharedMemoryOptions shm{options.name, options.size, options.huge_pages};
  // The kernel reserves huge pages globally, but the arena is bound to one node: pages free
  // only on other nodes would pass the reservation and fail the population (or fault with
  // SIGBUS). Too few on the node means normal pages from the start.
  const long needed = static_cast<long>((options.size + kHugePageSize - 1) / kHugePageSize);
  const long free_on_node = FreeHugePagesOnNode(options.sysfs_root, numa_node_);
  if (shm.try_huge_pages && free_on_node >= 0 && free_on_node < needed) {
    warnings_.push_back("NUMA node " + std::to_string(numa_node_) + " has " +
                        std::to_string(free_on_node) + " free 2 MiB huge pages of the " +
                        std::to_string(needed) +
                        " the arena needs: using 4 KiB pages, which are much slower to fault "
                        "in; reserve them with `sysctl vm.nr_hugepages=N`, or on this node "
                        "with /sys/devices/system/node/node" +
                        std::to_string(numa_node_) + "/hugepages/hugepages-2048kB/nr_hugepages");
    shm.try_huge_pages = false;
  }
  // Huge pages count as had only once reserved (SharedMemory::Create): too few free ones
  // fall back to 4 KiB pages here, never to ENOMEM at the Map below or SIGBUS later.
  BATON_ASSIGN_OR_RETURN(memory_, SharedMemory::Create(shm));
  if (shm.try_huge_pages && !memory_.huge_pages()) {
    std::ostringstream note;
    note << "huge pages unavailable (" << memory_.fallback_reason()
         << "; HugePages_Free=" << MeminfoValue("HugePages_Free")
         << "): using 4 KiB pages, which are much slower to fault in; reserve them with "
            "`sysctl vm.nr_hugepages=N` (N = bytes / 2 MiB)";
    warnings_.push_back(note.str());
  }
  BATON_ASSIGN_OR_RETURN(mapping_, memory_.Map(Protection::kReadWrite, /*populate=*/false));
  return OkStatus();
}

Status PinnedArena::Populate() {
  uint8_t* base = mapping_.data();
  const size_t size = mapping_.size();
  if (::madvise(base, size, MADV_POPULATE_WRITE) == 0) {
    // Verify that the policy took: the first page is where mbind said it should be.
    if (numa_bound_) {
      auto node = NodeOfAddress(base);
      if (node.ok() && *node != numa_node_) {
        warnings_.push_back("pages landed on NUMA node " + std::to_string(*node) + " instead of " +
                            std::to_string(numa_node_));
      }
    }
    return OkStatus();
  }
  const int err = errno;
  if (err != EINVAL) {
    // EFAULT/ENOMEM: the node has no memory (or no huge pages) left for the arena.
    return ResourceExhausted(ErrnoStatus("pre-faulting " + std::to_string(size) +
                                             " bytes of the weight arena on "
                                             "NUMA node " +
                                             std::to_string(numa_node_),
                                         err)
                                 .message() +
                             (memory_.huge_pages()
                                  ? " (are enough huge pages free on that node? see "
                                    "/sys/devices/system/node/node*/hugepages)"
                                  : ""));
  }
  // Kernels before 5.14 have no MADV_POPULATE_WRITE: touch each page once.
  const size_t page = memory_.huge_pages() ? kHugePageSize : static_cast<size_t>(::getpagesize());
  for (size_t off = 0; off < size; off += page) {
    reinterpret_cast<volatile uint8_t*>(base)[off] = 0;
  }
  return OkStatus();
}

void PinnedArena::Lock() {
  if (::mlock(mapping_.data(), mapping_.size()) == 0) {
    locked_ = true;
    return;
  }
  warnings_.push_back(MlockFailure(mapping_.size(), errno, memory_.huge_pages()));
}

void PinnedArena::SealReadOnly() {
  if (adopted_) return;  // Adopt() checked the seals; they are final
  const Status sealed = memory_.Seal(Sealing::kReadOnly);
  if (!sealed.ok()) {
    // F_ADD_SEALS is all or nothing: a kernel without F_SEAL_FUTURE_WRITE (before Linux 5.1)
    // still takes the size seals.
    const bool sized = memory_.Seal(Sealing::kFixedSize).ok();
    warnings_.push_back("the weights are not sealed read-only (" + sealed.message() +
                        (sized ? "; sealed against resizing only" : "") +
                        "): an engine could map them writable");
    return;
  }
  Result<UniqueFd> fd = memory_.Dup();
  Result<SharedMemory> peer =
      fd.ok() ? SharedMemory::Import(std::move(fd).value()) : Result<SharedMemory>(fd.status());
  if (peer.ok() && peer->Map(Protection::kReadWrite).ok()) {
    warnings_.push_back(
        "this kernel does not refuse writable mappings of the sealed weights "
        "(F_SEAL_FUTURE_WRITE)" +
        std::string(huge_pages() ? " on hugetlb memory" : "") + ": an engine could write them");
    return;
  }
  sealed_read_only_ = true;
}

}  // namespace baton
