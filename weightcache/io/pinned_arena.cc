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
#include "weightcache/io/huge_page_budget.h"
#include "weightcache/io/numa.h"

namespace baton {
namespace {

constexpr char kComponent[] = "arena";

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

// What one memfd of an adopted arena must be.
struct ExpectedPart {
  uint64_t size = 0;
  bool huge_pages = false;
  uint64_t inode = 0;
  uint64_t device = 0;
};

// Why `memory` is not the part `want` of the arena `record` describes; empty when it is.
std::string PartMismatch(const SharedMemory& memory, const ExpectedPart& want,
                         const ArenaRecord& record) {
  if (memory.size() != want.size) {
    return "the memfd holds " + std::to_string(memory.size()) + " bytes, the record says " +
           std::to_string(want.size);
  }
  if (memory.huge_pages() != want.huge_pages) {
    return std::string("the memfd has ") + (memory.huge_pages() ? "2 MiB" : "4 KiB") +
           " pages, the record says " + (want.huge_pages ? "2 MiB" : "4 KiB");
  }
  if (const std::string seals = SealMismatch(memory, record); !seals.empty()) return seals;
  struct stat st {};
  if (::fstat(memory.fd(), &st) != 0) return ErrnoStatus("fstat of the memfd", errno).message();
  if (st.st_ino != want.inode || st.st_dev != want.device) {
    return "the memfd is another object than the recorded one (inode " + std::to_string(st.st_ino) +
           ", recorded " + std::to_string(want.inode) + ")";
  }
  return "";
}

// Why `parts` are not the arena `record` describes; empty when they are.
std::string AdoptMismatch(const std::vector<SharedMemory>& parts, const ArenaRecord& record) {
  const bool two = record.first_size != 0 && record.first_size < record.size;
  if (parts.size() != (two ? 2u : 1u)) {
    return std::to_string(parts.size()) + " memfds, the record says " + (two ? "2" : "1");
  }
  const ExpectedPart first{.size = two ? record.first_size : record.size,
                           .huge_pages = record.huge_pages,
                           .inode = record.inode,
                           .device = record.device};
  if (std::string why = PartMismatch(parts[0], first, record); !why.empty()) return why;
  if (!two) return "";
  const ExpectedPart second{.size = record.size - record.first_size,
                            .huge_pages = false,
                            .inode = record.second_inode,
                            .device = record.second_device};
  std::string why = PartMismatch(parts[1], second, record);
  return why.empty() ? "" : "its 4 KiB part: " + why;
}

std::pair<uint64_t, uint64_t> IdentityOf(const SharedMemory& memory) {
  struct stat st {};
  if (memory.fd() < 0 || ::fstat(memory.fd(), &st) != 0) return {0, 0};
  return {static_cast<uint64_t>(st.st_ino), static_cast<uint64_t>(st.st_dev)};
}

}  // namespace

PinnedArena::~PinnedArena() { background_lock_.reset(); }

Result<PinnedArena> PinnedArena::Adopt(std::vector<SharedMemory> parts, const ArenaRecord& record,
                                       bool lock) {
  if (const std::string why = AdoptMismatch(parts, record); !why.empty()) {
    return FailedPrecondition("adopting the weight arena: " + why);
  }
  PinnedArena arena;
  arena.memory_ = std::move(parts[0]);
  if (parts.size() == 2) arena.second_ = std::move(parts[1]);
  BATON_ASSIGN_OR_RETURN(arena.mapping_, MapBackToBack(arena.memory_, arena.second_,
                                                       Protection::kReadOnly, /*populate=*/false));
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

std::pair<uint64_t, uint64_t> PinnedArena::identity() const { return IdentityOf(memory_); }

std::pair<uint64_t, uint64_t> PinnedArena::second_identity() const { return IdentityOf(second_); }

Result<std::vector<UniqueFd>> PinnedArena::DupFds() const {
  std::vector<UniqueFd> fds;
  for (const SharedMemory* part : {&memory_, &second_}) {
    if (part->size() == 0) continue;
    BATON_ASSIGN_OR_RETURN(UniqueFd fd, part->Dup());
    fds.push_back(std::move(fd));
  }
  return fds;
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

Result<std::vector<SharedMemory>> ImportArenaFds(std::vector<UniqueFd> fds) {
  if (fds.empty() || fds.size() > 2) {
    return InvalidArgument("a weight arena is 1 or 2 memfds, not " + std::to_string(fds.size()));
  }
  std::vector<SharedMemory> parts;
  for (UniqueFd& fd : fds) {
    BATON_ASSIGN_OR_RETURN(SharedMemory part, SharedMemory::Import(std::move(fd)));
    parts.push_back(std::move(part));
  }
  return parts;
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
                              << " on_2m=" << arena.huge_bytes() << " on_4k=" << arena.small_bytes()
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

Status PinnedArena::MapMemory(const ArenaOptions& options) {
  const HugePageBudget budget =
      options.huge_pages
          ? BudgetHugePages(options.size, numa_node_, options.max_huge_pages, options.sysfs_root)
          : HugePageBudget{};
  if (budget.pages > 0 && budget.pages < budget.needed) {
    BATON_RETURN_IF_ERROR(CreatePartial(options, budget.pages, budget.why));
  } else {
    SharedMemoryOptions shm{options.name, options.size, budget.pages > 0};
    if (options.huge_pages && budget.pages == 0) {
      warnings_.push_back(budget.why +
                          ": using 4 KiB pages, which are much slower to fault in; reserve "
                          "them with `sysctl vm.nr_hugepages=N`, or on this node with "
                          "/sys/devices/system/node/node" +
                          std::to_string(numa_node_) + "/hugepages/hugepages-2048kB/nr_hugepages");
    }
    // Huge pages count as had only once reserved (SharedMemory::Create): too few free ones
    // fall back to 4 KiB pages here, never to ENOMEM at the Map below or SIGBUS later.
    BATON_ASSIGN_OR_RETURN(memory_, SharedMemory::Create(shm));
    if (shm.try_huge_pages && !memory_.huge_pages()) NoteHugePageFallback();
  }
  BATON_ASSIGN_OR_RETURN(mapping_, MapBackToBack(memory_, second_, Protection::kReadWrite,
                                                 /*populate=*/false));
  return OkStatus();
}

void PinnedArena::NoteHugePageFallback() {
  std::ostringstream note;
  note << "huge pages unavailable (" << memory_.fallback_reason()
       << "; HugePages_Free=" << MeminfoValue("HugePages_Free")
       << "): using 4 KiB pages, which are much slower to fault in; reserve them with "
          "`sysctl vm.nr_hugepages=N` (N = bytes / 2 MiB)";
  warnings_.push_back(note.str());
}

// The first `huge_pages` x 2 MiB in a hugetlb memfd, the rest in a memfd of 4 KiB pages.
Status PinnedArena::CreatePartial(const ArenaOptions& options, uint64_t huge_pages,
                                  const std::string& why) {
  const uint64_t first_size = huge_pages * kHugePageSize;
  BATON_ASSIGN_OR_RETURN(memory_, SharedMemory::Create({options.name, first_size, true}));
  if (!memory_.huge_pages()) {  // taken by another process since they were counted
    NoteHugePageFallback();
    BATON_ASSIGN_OR_RETURN(memory_, SharedMemory::Create({options.name, options.size, false}));
    return OkStatus();
  }
  BATON_ASSIGN_OR_RETURN(
      second_, SharedMemory::Create({options.name + "-4k", options.size - first_size, false}));
  warnings_.push_back("partial huge pages: " + std::to_string(huge_bytes()) +
                      " bytes on 2 MiB pages, " + std::to_string(second_.size()) +
                      " bytes on 4 KiB pages (" + why +
                      "); the 4 KiB part is much slower to fault in; reserve more with "
                      "`sysctl vm.nr_hugepages=N`");
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
  const size_t page =
      memory_.huge_pages() && !partial() ? kHugePageSize : static_cast<size_t>(::getpagesize());
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
  bool sealed = SealPart(memory_);
  if (partial()) sealed = SealPart(second_) && sealed;
  sealed_read_only_ = sealed;
}

bool PinnedArena::SealPart(SharedMemory& part) {
  const Status sealed = part.Seal(Sealing::kReadOnly);
  if (!sealed.ok()) {
    // F_ADD_SEALS is all or nothing: a kernel without F_SEAL_FUTURE_WRITE (before Linux 5.1)
    // still takes the size seals.
    const bool sized = part.Seal(Sealing::kFixedSize).ok();
    warnings_.push_back("the weights are not sealed read-only (" + sealed.message() +
                        (sized ? "; sealed against resizing only" : "") +
                        "): an engine could map them writable");
    return false;
  }
  Result<UniqueFd> fd = part.Dup();
  Result<SharedMemory> peer =
      fd.ok() ? SharedMemory::Import(std::move(fd).value()) : Result<SharedMemory>(fd.status());
  if (peer.ok() && peer->Map(Protection::kReadWrite).ok()) {
    warnings_.push_back(
        "this kernel does not refuse writable mappings of the sealed weights "
        "(F_SEAL_FUTURE_WRITE)" +
        std::string(part.huge_pages() ? " on hugetlb memory" : "") +
        ": an engine could write them");
    return false;
  }
  return true;
}

}  // namespace baton
