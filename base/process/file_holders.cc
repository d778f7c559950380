#include "base/process/file_holders.h"

#include <dirent.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <string>
#include <string_view>

#include "base/process/proc_table.h"

namespace baton {
namespace {

bool Wanted(std::span<const FileId> files, FileId id) {
  return id.ino != 0 && std::find(files.begin(), files.end(), id) != files.end();
}

// A line of /proc/PID/maps: "start-end perms offset major:minor inode [path]", the device in
// hex.
bool MapsAnyOf(pid_t pid, std::span<const FileId> files) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/maps");
  std::string line;
  while (std::getline(in, line)) {
    unsigned major_dev = 0, minor_dev = 0;
    uint64_t ino = 0;
    if (std::sscanf(line.c_str(), "%*x-%*x %*s %*x %x:%x %" SCNu64, &major_dev, &minor_dev, &ino) !=
        3) {
      continue;
    }
    if (Wanted(files, FileId{.dev = makedev(major_dev, minor_dev), .ino = ino})) return true;
  }
  return false;
}

// Only fds whose link names a memfd ("/memfd:NAME (deleted)") are stat'ed: a stat of any
// other could block on a file on a hung network or FUSE mount.
bool HoldsOpenAnyOf(pid_t pid, std::span<const FileId> files) {
  const std::string dir_path = "/proc/" + std::to_string(pid) + "/fd";
  DIR* dir = ::opendir(dir_path.c_str());
  if (dir == nullptr) return false;
  bool found = false;
  while (const dirent* e = ::readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    const std::string link = dir_path + "/" + e->d_name;
    char target[16] = {};
    const ssize_t n = ::readlink(link.c_str(), target, sizeof(target) - 1);
    if (n < 7 || std::string_view(target, 7) != "/memfd:") continue;
    struct stat st {};
    if (::stat(link.c_str(), &st) != 0) continue;
    if (Wanted(files, FileId{.dev = st.st_dev, .ino = st.st_ino})) {
      found = true;
      break;
    }
  }
  ::closedir(dir);
  return found;
}

}  // namespace

FileId FileIdOf(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return {};
  return FileId{.dev = st.st_dev, .ino = st.st_ino};
}

bool HoldsAnyOf(pid_t pid, std::span<const FileId> files) {
  return MapsAnyOf(pid, files) || HoldsOpenAnyOf(pid, files);
}

std::vector<pid_t> ProcessesHolding(std::span<const FileId> files, std::span<const pid_t> exclude) {
  std::vector<pid_t> out;
  for (pid_t pid : ListPids()) {
    if (std::find(exclude.begin(), exclude.end(), pid) != exclude.end()) continue;
    if (HoldsAnyOf(pid, files)) out.push_back(pid);
  }
  return out;
}

}  // namespace baton
