#include "base/io/small_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/io/private_dir.h"
#include "base/io/unique_fd.h"

namespace baton {

Status WriteAll(int fd, const std::string& bytes, const std::string& what) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus("write " + what, errno);
    done += static_cast<size_t>(n);
  }
  return OkStatus();
}

std::string ParentDir(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

namespace {

// Writes PATH.tmp and renames it over PATH; with `sync`, fsyncs the file before the rename.
Status WriteAndRename(const std::string& path, const std::string& bytes, bool sync) {
  const std::string tmp = path + ".tmp";
  {
    UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | kPrivateFileFlags, 0600));
    if (!fd) return PrivateFileOpenError("create", tmp, errno);
    BATON_RETURN_IF_ERROR(WriteAll(fd.get(), bytes, tmp));
    if (sync && ::fsync(fd.get()) != 0) return ErrnoStatus("fsync " + tmp, errno);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return ErrnoStatus("rename " + tmp + " to " + path, errno);
  }
  return OkStatus();
}

}  // namespace

Status ReplaceFile(const std::string& path, const std::string& bytes) {
  return WriteAndRename(path, bytes, /*sync=*/false);
}

Status WriteFileAtomically(const std::string& path, const std::string& bytes) {
  BATON_RETURN_IF_ERROR(WriteAndRename(path, bytes, /*sync=*/true));
  const std::string dir = ParentDir(path);
  UniqueFd dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir_fd) return ErrnoStatus("open directory " + dir, errno);
  if (::fsync(dir_fd.get()) != 0) return ErrnoStatus("fsync directory " + dir, errno);
  return OkStatus();
}

Result<std::string> ReadSmallFile(const std::string& path, size_t limit) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return ErrnoStatus("open " + path, errno);
  std::string bytes;
  char buf[512];
  while (bytes.size() <= limit) {
    const ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus("read " + path, errno);
    if (n == 0) break;
    bytes.append(buf, static_cast<size_t>(n));
  }
  return bytes;
}

Result<std::string> ReadRegularFile(const std::string& path, size_t limit) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));  // a FIFO: no wait
  if (!fd) return NotFound(path + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus("stat " + path, errno);
  if (S_ISDIR(st.st_mode)) return InvalidArgument(path + ": is a directory");
  if (!S_ISREG(st.st_mode)) return InvalidArgument(path + ": not a regular file");
  std::string bytes;
  char buf[4096];
  while (bytes.size() <= limit) {
    const ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus("read " + path, errno);
    if (n == 0) return bytes;
    bytes.append(buf, static_cast<size_t>(n));
  }
  return InvalidArgument(path + ": longer than " + std::to_string(limit) + " bytes");
}

}  // namespace baton
