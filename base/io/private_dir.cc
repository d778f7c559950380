#include "base/io/private_dir.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>

#include "base/io/small_file.h"

namespace baton {
namespace {

// `path` without trailing slashes: lstat("link/") would follow the link.
std::string Trimmed(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

std::string Octal(mode_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

std::string Fix(const std::string& setting) {
  return "remove it, or set " + setting + " to a directory of your own";
}

// Whether a client running as root may trust a directory of another user at `path`: its parent
// is root's and only root can write to it, so root made it (systemd's /run/baton). The parent
// is followed if it is a symbolic link (/var/run -> /run).
bool RootMadeIt(const std::string& path) {
  struct stat parent {};
  if (::stat(ParentDir(path).c_str(), &parent) != 0 || !S_ISDIR(parent.st_mode)) return false;
  return parent.st_uid == 0 && (parent.st_mode & 022) == 0;
}

bool OwnerAccepted(const std::string& path, uid_t owner, DirOwner rule) {
  const uid_t self = ::geteuid();
  if (owner == self) return true;
  if (rule == DirOwner::kSelf) return false;
  return owner == 0 || (self == 0 && RootMadeIt(path));
}

}  // namespace

Status CheckPrivateDir(const std::string& path, DirOwner owner, const std::string& what,
                       const std::string& setting) {
  const std::string p = Trimmed(path);
  const std::string named = what + " " + path;
  struct stat st {};
  if (::lstat(p.c_str(), &st) != 0) {
    if (errno == ENOENT) return NotFound(named + " does not exist");
    return ErrnoStatus("stat " + named, errno);
  }
  if (S_ISLNK(st.st_mode)) {
    return FailedPrecondition(named + " is a symbolic link (owned by uid " +
                              std::to_string(st.st_uid) + "): not followed; " + Fix(setting));
  }
  if (!S_ISDIR(st.st_mode))
    return FailedPrecondition(named + " is not a directory; " + Fix(setting));
  if (!OwnerAccepted(p, st.st_uid, owner)) {
    const std::string whom =
        owner == DirOwner::kSelf ? "" : (::geteuid() == 0 ? " nor made by root" : " nor by root");
    return FailedPrecondition(named + " is owned by uid " + std::to_string(st.st_uid) + " (mode " +
                              Octal(st.st_mode) + "), not by this user (uid " +
                              std::to_string(::geteuid()) + ")" + whom +
                              ": another user may control what is in it; " + Fix(setting));
  }
  if ((st.st_mode & 022) != 0) {
    return FailedPrecondition(named + " has mode " + Octal(st.st_mode) +
                              ": its group or others can write to it; chmod go-w it, or " +
                              Fix(setting));
  }
  return OkStatus();
}

Status EnsurePrivateDir(const std::string& path, const std::string& what,
                        const std::string& setting) {
  const std::string p = Trimmed(path);
  const std::string parent = ParentDir(p);
  std::error_code ec;
  if (!std::filesystem::exists(parent, ec)) {
    std::filesystem::create_directories(parent, ec);
    if (ec)
      return Status(StatusCode::kIoError, "creating directory " + parent + ": " + ec.message());
  }
  if (::mkdir(p.c_str(), 0700) == 0) {
    // The umask may have taken bits away; none of group's or others' were there to take.
    if (::chmod(p.c_str(), 0700) != 0) return ErrnoStatus("chmod 0700 " + p, errno);
  } else if (errno != EEXIST) {
    return ErrnoStatus("creating " + what + " " + path, errno);
  }
  return CheckPrivateDir(path, DirOwner::kSelf, what, setting);
}

Status PrivateFileOpenError(const std::string& what, const std::string& path, int err) {
  if (err == ELOOP) {
    return FailedPrecondition(what + " " + path +
                              " is a symbolic link: not followed (another user may have put it "
                              "there); remove it");
  }
  return ErrnoStatus(what + " " + path, err);
}

}  // namespace baton
