// LockFile: one process at a time for a resource (a controller's runtime directory, its epoch
// journal), by an exclusive flock on a lock file, held for as long as the returned fd is open.
//
// The lock is the kernel's: it goes with the process, however it ends (kill -9 included),
// and a program the holder starts does not inherit it (the fd is close-on-exec), so engines
// that outlive their controller never keep the next one out. The file holds the holder's pid,
// for the message the next process gets.
#pragma once

#include <string>

#include "base/io/unique_fd.h"
#include "base/status.h"

namespace baton {

// Locks `path` (created, mode 0600, if absent) without waiting and writes this process's pid
// into it. Unavailable when another process holds it: "<what> is in use by another process
// (pid N holds <path>)". FailedPrecondition when `path` is a symbolic link: it is never
// followed (base/io/private_dir.h). An error of its own for a file that cannot be opened or
// locked.
Result<UniqueFd> LockFile(const std::string& path, const std::string& what);

}  // namespace baton
