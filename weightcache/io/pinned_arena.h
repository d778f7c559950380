// PinnedArena: the weight cache's host memory: a memfd (2 MiB hugetlb pages when the
// system has them reserved), bound to one NUMA node with mbind, locked with mlock, and
// shareable with engines by fd.
//
// The NUMA node is, in order: options.numa_node when >= 0; the node of the GPU whose PCI bus
// id is options.gpu_pci_bus_id (from /sys/bus/pci/devices/<id>/numa_node); the node of the
// CPU the caller runs on. Binding happens before the first touch, so pages land on that
// node. When huge pages, mbind or mlock are unavailable the arena still works and says so
// (warnings() and the log), with the way to fix it (e.g. raise `ulimit -l`, or reserve
// pages with `sysctl vm.nr_hugepages=N`). Move-only; owns the memfd and the mapping.
//
// Order at creation: memfd, mapping (without pre-faulting), mbind, pre-fault with
// MADV_POPULATE_WRITE (a page walk on kernels without it), mlock.
//
// Huge pages: the arena takes as many 2 MiB pages as it may (HugePageBudget: free on its
// node and on the machine, at most options.max_huge_pages). All of them: one hugetlb memfd.
// None: one memfd of 4 KiB pages. Some: a partial arena of two memfds mapped back to back
// (MapBackToBack), the first hugetlb with the pages it could have (the split falls on a 2 MiB
// boundary, whatever tensor lies across it), the second of 4 KiB pages for the rest; offsets
// are the same as in a one-memfd arena, and warnings() says how much is on each and why. A
// hugetlb memfd whose pages cannot be reserved after all (another process took them) falls
// back to 4 KiB pages for the whole arena. Engines receive DupFds() and map them read-only,
// back to back, in that order.
//
// Adopt() wraps a memfd that an earlier process created and filled (a controller's arena kept
// alive by baton-keeper across its restart): it checks the memfd against what that process
// recorded, maps it read-only without pre-faulting and locks the new mapping in a background
// thread (BackgroundLock, owned by the arena and joined when it is destroyed), so adopting
// costs no page walk. All methods run on the owner's thread; locked() and warnings() may also
// be read while the background lock runs.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "proto/transport/shared_memory.h"
#include "weightcache/io/background_lock.h"

namespace baton {

struct ArenaOptions {
  std::string name = "baton-weights";
  uint64_t size = 0;
  int numa_node = -1;          // -1: choose as described above
  std::string gpu_pci_bus_id;  // e.g. "0000:17:00.0"; empty when none
  bool huge_pages = true;
  int64_t max_huge_pages = -1;      // at most this many 2 MiB pages; -1: as many as are free
  bool lock = true;                 // mlock
  bool populate = true;             // pre-fault at creation, never on a later hot path
  std::string sysfs_root = "/sys";  // where NUMA topology is read (tests point it elsewhere)
};

// What the creator of an arena recorded about it (WeightManifest keeps it), for Adopt().
struct ArenaRecord {
  uint64_t size = 0;
  uint64_t inode = 0;  // of the memfd (fstat): which object it is
  uint64_t device = 0;
  bool huge_pages = false;  // of the first memfd
  // A partial arena: the size of its first (hugetlb) memfd and the identity of its second;
  // all 0 for an arena of one memfd.
  uint64_t first_size = 0;
  uint64_t second_inode = 0;
  uint64_t second_device = 0;
  int numa_node = 0;
  bool numa_bound = false;
  std::string numa_source;
  bool sealed_read_only = false;
};

class PinnedArena {
 public:
  static Result<PinnedArena> Create(const ArenaOptions& options);
  // Takes over `memory`, an arena another process created and filled. Refused
  // (FailedPrecondition) unless its size and page kind are the record's, when the record says
  // sealed_read_only its seals include F_SEAL_FUTURE_WRITE, F_SEAL_SHRINK and F_SEAL_GROW,
  // and it is the very object recorded (inode and device). The memory is mapped READ-ONLY and not
  // pre-faulted: data() points into that mapping, and writing through it faults (SIGSEGV). The NUMA
  // node, binding and seal state are the record's (the pages were placed when the memory was
  // created). With `lock`, the mapping is mlock'd by a background thread: locked() turns true when
  // it is done, and a failure is added to warnings(); AwaitLock() waits for it.
  // `parts` are the arena's memfds in order (one, or two for a partial arena); each is checked
  // as above, the second against record.second_*.
  static Result<PinnedArena> Adopt(std::vector<SharedMemory> parts, const ArenaRecord& record,
                                   bool lock);
  static Result<PinnedArena> Adopt(SharedMemory memory, const ArenaRecord& record, bool lock) {
    std::vector<SharedMemory> parts;
    parts.push_back(std::move(memory));
    return Adopt(std::move(parts), record, lock);
  }

  PinnedArena() = default;
  ~PinnedArena();
  PinnedArena(PinnedArena&&) noexcept = default;
  PinnedArena& operator=(PinnedArena&&) noexcept = default;

  // Writable for an arena made by Create(); read-only (a write faults) for an adopted one.
  uint8_t* data() const { return mapping_.data(); }
  uint64_t size() const { return mapping_.size(); }
  // The first (or only) memfd; second_memory() is the 4 KiB part of a partial arena (size 0
  // otherwise).
  const SharedMemory& memory() const { return memory_; }
  const SharedMemory& second_memory() const { return second_; }
  bool partial() const { return second_.size() > 0; }
  // New fds of the arena's memfds, in order: what an engine or baton-keeper is sent.
  Result<std::vector<UniqueFd>> DupFds() const;
  // The memfd's inode and device (fstat), for ArenaRecord; {0, 0} if fstat fails.
  std::pair<uint64_t, uint64_t> identity() const;
  std::pair<uint64_t, uint64_t> second_identity() const;
  // The first (or only) memfd is hugetlb: all of the arena, or the first part of a partial one.
  bool huge_pages() const { return memory_.huge_pages(); }
  // Bytes on 2 MiB pages and on 4 KiB pages; they add up to size().
  uint64_t huge_bytes() const { return memory_.huge_pages() ? memory_.size() : 0; }
  uint64_t small_bytes() const { return size() - huge_bytes(); }
  bool locked() const { return locked_ || (background_lock_ && background_lock_->locked()); }
  // True while a background mlock (of an adopted arena) is still running.
  bool lock_pending() const { return background_lock_ && !background_lock_->done(); }
  bool adopted() const { return adopted_; }
  // Blocks until an adopted arena's background mlock has finished; returns at once otherwise.
  void AwaitLock() const;
  int numa_node() const { return numa_node_; }
  bool numa_bound() const { return numa_bound_; }
  // Where the node came from: "config", "gpu dddd:bb:dd.f", "local cpu".
  const std::string& numa_source() const { return numa_source_; }
  // Human-readable notes on whatever fell back (huge pages, mbind, mlock); a copy, since the
  // background lock of an adopted arena may add one.
  std::vector<std::string> warnings() const;
  // Seals the memfd read-only (Sealing::kReadOnly) once it is filled: engines can then
  // neither map it writable nor resize it; this arena's own mapping stays writable. Then
  // checks that the kernel refuses a writable mapping. Where it cannot seal or the kernel
  // does not enforce the seal, the arena works unprotected and warnings() says so.
  void SealReadOnly();  // not for an adopted arena, whose seals are checked by Adopt()
  // True once the kernel refuses writable mappings of the arena to everyone but its owner.
  bool sealed_read_only() const { return sealed_read_only_; }

 private:
  // Declared before mapping_: a move-assignment stops (joins) the old background lock before
  // the old mapping is unmapped; the destructor stops it first explicitly.
  std::unique_ptr<BackgroundLock> background_lock_;
  SharedMemory memory_;
  SharedMemory second_;
  Mapping mapping_;
  Status MapMemory(const ArenaOptions& options);
  Status CreatePartial(const ArenaOptions& options, uint64_t huge_pages, const std::string& why);
  void NoteHugePageFallback();
  bool SealPart(SharedMemory& part);
  Status ChooseNode(const ArenaOptions& options);
  Status Populate();
  void Lock();

  int numa_node_ = 0;
  std::string numa_source_;
  bool numa_bound_ = false;
  bool locked_ = false;
  bool sealed_read_only_ = false;
  bool adopted_ = false;
  std::vector<std::string> warnings_;
};

// Wraps the memfds of an arena received from another process (SharedMemory::Import each), in
// order; refused unless there are one or two.
Result<std::vector<SharedMemory>> ImportArenaFds(std::vector<UniqueFd> fds);

// The NUMA node that ArenaOptions would choose (exposed for tests and `baton-weights`).
int ChooseNumaNode(int requested, const std::string& gpu_pci_bus_id);
// The same, reading topology under `sysfs_root` instead of /sys.
int ChooseNumaNode(int requested, const std::string& gpu_pci_bus_id, const std::string& sysfs_root);

}  // namespace baton
