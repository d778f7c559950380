// Which processes hold a memfd: map it (/proc/PID/maps) or keep it open (/proc/PID/fd: only
// fds that name a memfd are looked at, so that no stat blocks on a hung mount). The
// controller's start without a roster uses it to find every process that still maps the memory
// baton-keeper kept (Controller::ClearHoldersOfKeptMemory), whatever its process group or
// cgroup became. Plain functions reading /proc; thread-compatible.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <span>
#include <vector>

namespace baton {

// A file as the kernel names it: the st_dev and st_ino of fstat.
struct FileId {
  uint64_t dev = 0;
  uint64_t ino = 0;
  bool operator==(const FileId&) const = default;
};

// The id of the file open at `fd`; nothing (ino 0) when fstat fails.
FileId FileIdOf(int fd);

// Whether `pid` maps one of `files` or holds one open (memfds only: an fd of another kind
// is not looked at). A process this one may not inspect
// (another user's without the privilege, one gone meanwhile) holds nothing.
bool HoldsAnyOf(pid_t pid, std::span<const FileId> files);

// Every process but `exclude` that maps one of `files` or holds one open, in no order.
std::vector<pid_t> ProcessesHolding(std::span<const FileId> files, std::span<const pid_t> exclude);

}  // namespace baton
