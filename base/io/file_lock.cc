#include "base/io/file_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>

#include "base/io/private_dir.h"

namespace baton {
namespace {

// The pid the holder wrote, or "" when the file holds none (a holder still writing it).
std::string HolderPid(int fd) {
  char buf[32] = {};
  const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
  if (n <= 0) return "";
  long pid = 0;
  const auto [end, ec] = std::from_chars(buf, buf + n, pid);
  if (ec != std::errc() || pid <= 0) return "";
  return std::to_string(pid);
}

}  // namespace

Result<UniqueFd> LockFile(const std::string& path, const std::string& what) {
  UniqueFd lock(::open(path.c_str(), O_RDWR | O_CREAT | kPrivateFileFlags, 0600));
  if (!lock) return PrivateFileOpenError("open lock file", path, errno);
  if (::flock(lock.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK) return ErrnoStatus("flock " + path, errno);
    const std::string pid = HolderPid(lock.get());
    return Unavailable(what + " is in use by another process (" +
                       (pid.empty() ? std::string("a process") : "pid " + pid) + " holds " + path +
                       ")");
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(lock.get(), 0) != 0 ||
      ::pwrite(lock.get(), pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    return ErrnoStatus("writing the pid into lock file " + path, errno);
  }
  return lock;
}

}  // namespace baton
