// Private directories: where a Baton process keeps its sockets, its lock and its state
// (controller.runtime_dir, controller.state_dir, engine.log_dir), and the files in them.
//
// Such a directory must be Baton's own. The default runtime directory, /tmp/baton-<uid>, is in
// a directory every local user can write to: another user could make it first and then put a
// symbolic link where the lock goes (the controller would overwrite the file it points to) or
// a socket of their own where controller.sock goes (batonctl and routers would talk to them).
// As tmux and ssh-agent do for theirs, a directory is used only when lstat() finds a real
// directory (not a symbolic link), owned by the right user, that neither its group nor others
// can write to (mode & 022 == 0). Read and search bits for the group are fine: systemd makes
// /run/baton with RuntimeDirectoryMode=0750.
//
// Who is the right owner:
//   * DirOwner::kSelf, for the process that makes the directory and keeps files in it (the
//     controller): the effective uid, nobody else.
//   * DirOwner::kSelfOrRoot, for a client that connects through a socket in it (batonctl, the
//     router): the effective uid or root. A client running as root also accepts a directory
//     owned by any user when the directory's parent is root's and not writable by group or
//     others (systemd's /run/baton, owned by the service user baton): only root could have
//     made it there. Under /tmp (writable by all) root accepts only its own.
//
// Files Baton creates or writes in these directories are opened with kPrivateFileFlags: a
// symbolic link there is refused (ELOOP), never followed. Plain functions; thread-compatible.
#pragma once

#include <fcntl.h>

#include <string>

#include "base/status.h"

namespace baton {

enum class DirOwner { kSelf, kSelfOrRoot };

// Creates `path` when absent (missing parents as std::filesystem::create_directories does,
// `path` itself with mode 0700), then checks it as CheckPrivateDir(path, kSelf, ...). An
// existing directory is used as it is: its mode is not changed.
// `what` names the directory in errors ("runtime directory"), `setting` is what the user sets
// to choose another ("controller.runtime_dir").
Status EnsurePrivateDir(const std::string& path, const std::string& what,
                        const std::string& setting);

// FailedPrecondition naming the path, what was found (a symbolic link, not a directory, the
// owner's uid, the mode) and what to do, unless `path` is a real directory owned as `owner`
// says and not writable by group or others. NotFound when `path` does not exist (a client
// then fails to connect as it would have), an error of its own when lstat() fails otherwise.
Status CheckPrivateDir(const std::string& path, DirOwner owner, const std::string& what,
                       const std::string& setting);

// open() flags to add for a file in a private directory.
inline constexpr int kPrivateFileFlags = O_NOFOLLOW | O_CLOEXEC;

// The error for a failed open() with kPrivateFileFlags of `path`: for ELOOP, "<what> <path> is
// a symbolic link: not followed; remove it"; otherwise ErrnoStatus(what + " " + path, err).
Status PrivateFileOpenError(const std::string& what, const std::string& path, int err);

}  // namespace baton
