#include "weightcache/file_identity.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>

namespace baton {
namespace {

constexpr std::string_view kSuffix = ".safetensors";
constexpr std::string_view kIndexName = "model.safetensors.index.json";

std::string JoinPath(const std::string& dir, std::string_view name) {
  std::string path = dir;
  if (!path.empty() && path.back() != '/') path += '/';
  path += name;
  return path;
}

bool IsModelEntry(std::string_view name) {
  if (name == kIndexName) return true;
  return name.size() > kSuffix.size() && name.substr(name.size() - kSuffix.size()) == kSuffix;
}

// "size 1234 -> 1240", or the first other field that differs; empty when none does.
std::string Difference(const FileIdentity& was, const FileIdentity& now) {
  auto change = [](const char* field, auto a, auto b) {
    return std::string(field) + " " + std::to_string(a) + " -> " + std::to_string(b);
  };
  if (was.size != now.size) return change("size", was.size, now.size);
  if (was.mtime_ns != now.mtime_ns) return change("mtime_ns", was.mtime_ns, now.mtime_ns);
  if (was.inode != now.inode) return change("inode", was.inode, now.inode) + ": replaced";
  if (was.device != now.device) return change("device", was.device, now.device);
  return "";
}

// stat(2) of `path` into `id`; 0 or errno.
int StatInto(const std::string& path, FileIdentity* id) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return errno;
  id->size = static_cast<uint64_t>(st.st_size);
  id->mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
  id->inode = static_cast<uint64_t>(st.st_ino);
  id->device = static_cast<uint64_t>(st.st_dev);
  return 0;
}

}  // namespace

Result<FileIdentity> StatFileIdentity(const std::string& dir, const std::string& name) {
  FileIdentity id;
  id.name = name;
  const std::string path = JoinPath(dir, name);
  if (const int err = StatInto(path, &id); err != 0) return ErrnoStatus(path + ": stat", err);
  return id;
}

std::string FirstChangedFile(const std::string& dir, const std::vector<FileIdentity>& files,
                             std::string_view when) {
  for (const FileIdentity& was : files) {
    FileIdentity now = was;
    if (const int err = StatInto(JoinPath(dir, was.name), &now); err != 0) {
      return was.name + (err == ENOENT ? " is gone " : " cannot be looked at ") +
             std::string(when) + " (stat: " + std::strerror(err) + ")";
    }
    if (std::string d = Difference(was, now); !d.empty()) {
      return was.name + " changed " + std::string(when) + " (" + d + ")";
    }
  }
  return "";
}

Result<std::vector<std::string>> ListModelEntries(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> names;
  std::error_code ec;
  fs::directory_iterator it(dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (IsModelEntry(name)) names.push_back(std::move(name));
  }
  if (ec) return Status(StatusCode::kIoError, dir + ": listing: " + ec.message());
  std::sort(names.begin(), names.end());
  return names;
}

std::string FirstChangedEntry(const std::vector<std::string>& was,
                              const std::vector<std::string>& now, const std::string& dir,
                              std::string_view when) {
  auto w = was.begin();
  auto n = now.begin();
  while (w != was.end() || n != now.end()) {
    if (n == now.end() || (w != was.end() && *w < *n)) {
      return *w + " was removed from " + dir + " " + std::string(when);
    }
    if (w == was.end() || *n < *w) return *n + " was added to " + dir + " " + std::string(when);
    ++w;
    ++n;
  }
  return "";
}

Result<std::string> CanonicalPath(const std::string& dir) {
  std::unique_ptr<char, decltype(&std::free)> real(::realpath(dir.c_str(), nullptr), &std::free);
  if (real == nullptr) return ErrnoStatus(dir + ": realpath", errno);
  return std::string(real.get());
}

bool IsPlainFileName(std::string_view name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find_first_of(std::string_view("/\0", 2)) == std::string_view::npos;
}

}  // namespace baton
