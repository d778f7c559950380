#include "controller/engines/engine_logs.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <vector>

#include "base/io/private_dir.h"
#include "base/io/unique_fd.h"
#include "base/log.h"

namespace baton {
namespace {

constexpr auto kRotateEvery = std::chrono::seconds(5);
constexpr const char* kLog = "controller";

// The regular files of `dir` whose names EngineLogId() knows, by id.
std::multimap<uint64_t, std::string> LogFiles(const std::string& dir) {
  std::multimap<uint64_t, std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (const uint64_t id = EngineLogId(name); id != 0) out.emplace(id, name);
  }
  ::closedir(d);
  return out;
}

Status CopyAll(int from, int to) {
  for (;;) {
    const ssize_t n = ::copy_file_range(from, nullptr, to, nullptr, 1 << 30, 0);
    if (n == 0) return OkStatus();
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus("copy_file_range", errno);
  }
}

// The last non-empty line of `text`, without its line end.
std::string LastLineOf(std::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' '))
    text.remove_suffix(1);
  const size_t start = text.rfind('\n');
  return std::string(start == std::string_view::npos ? text : text.substr(start + 1));
}

// Adds the `n` highest of `ids` to `kept`.
void KeepHighest(const std::set<uint64_t>& ids, size_t n, std::set<uint64_t>* kept) {
  size_t taken = 0;
  for (auto it = ids.rbegin(); it != ids.rend() && taken < n; ++it, ++taken) kept->insert(*it);
}

}  // namespace

std::string EngineLogs::LastLine(uint64_t id) const {
  constexpr size_t kTail = 4096;
  constexpr size_t kMaxLine = 240;
  if (dir_.empty()) return "";
  UniqueFd fd(
      ::open((dir_ + "/engine-" + std::to_string(id) + ".log").c_str(), O_RDONLY | O_CLOEXEC));
  struct stat st {};
  if (!fd.valid() || ::fstat(fd.get(), &st) != 0 || st.st_size <= 0) return "";
  const size_t size = static_cast<size_t>(st.st_size);
  std::string tail(std::min(size, kTail), '\0');
  const ssize_t n = ::pread(fd.get(), tail.data(), tail.size(), size - tail.size());
  if (n <= 0) return "";
  tail.resize(static_cast<size_t>(n));
  std::string line = LastLineOf(tail);
  for (char& c : line) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  }
  if (line.size() > kMaxLine) line = line.substr(0, kMaxLine) + "...";
  return line;
}

uint64_t EngineLogId(const std::string& name) {
  constexpr std::string_view kPrefix = "engine-";
  if (name.rfind(kPrefix, 0) != 0) return 0;
  size_t i = kPrefix.size();
  uint64_t id = 0;
  const size_t digits_start = i;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9' && i - digits_start < 19) {
    id = id * 10 + static_cast<uint64_t>(name[i++] - '0');
  }
  if (i == digits_start) return 0;
  const std::string rest = name.substr(i);
  for (const char* suffix : {".log", ".log.1", ".crash.log", ".crash.log.1"}) {
    if (rest == suffix) return id;
  }
  return 0;
}

bool IsCrashLog(const std::string& name) {
  return EngineLogId(name) != 0 && name.find(".crash.log") != std::string::npos;
}

EngineLogs::EngineLogs(boost::asio::io_context& io, std::string dir, uint64_t max_bytes,
                       size_t keep, size_t crash_keep)
    : timer_(io),
      dir_(std::move(dir)),
      max_bytes_(max_bytes),
      keep_(keep),
      crash_keep_(crash_keep) {}

void EngineLogs::Start() {
  if (dir_.empty() || max_bytes_ == 0) return;
  Arm();
}

void EngineLogs::Arm() {
  timer_.expires_after(kRotateEvery);
  timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;
    RotateNow();
    Arm();
  });
}

size_t EngineLogs::RotateNow() {
  if (dir_.empty() || max_bytes_ == 0) return 0;  // no directory, or never rotated
  size_t rotated = 0;
  for (const auto& [id, name] : LogFiles(dir_)) {
    // A crash log is evidence kept whole: never copied over its .1 nor truncated.
    if (name.size() < 4 || name.compare(name.size() - 4, 4, ".log") != 0 || IsCrashLog(name)) {
      continue;
    }
    const std::string path = dir_ + "/" + name;
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 || static_cast<uint64_t>(st.st_size) <= max_bytes_) {
      continue;
    }
    if (Status s = Rotate(path); !s.ok()) {
      BATON_LOG(WARN, kLog) << "engine log " << path << " not rotated: " << s.message();
      continue;
    }
    ++rotated;
  }
  return rotated;
}

Status EngineLogs::Rotate(const std::string& path) {
  UniqueFd from(::open(path.c_str(), O_RDWR | kPrivateFileFlags));
  if (!from.valid()) return PrivateFileOpenError("open engine log", path, errno);
  const std::string copy = path + ".1";
  UniqueFd to(::open(copy.c_str(), O_WRONLY | O_CREAT | O_TRUNC | kPrivateFileFlags, 0640));
  if (!to.valid()) return PrivateFileOpenError("open engine log", copy, errno);
  BATON_RETURN_IF_ERROR(CopyAll(from.get(), to.get()));
  if (::ftruncate(from.get(), 0) != 0) return ErrnoStatus("ftruncate " + path, errno);
  ++rotations_;
  BATON_LOG(INFO, kLog) << "engine log " << path << " rotated to " << copy;
  return OkStatus();
}

void EngineLogs::Prune(const std::set<uint64_t>& live) {
  if (dir_.empty()) return;
  const std::multimap<uint64_t, std::string> files = LogFiles(dir_);
  std::set<uint64_t> ids, crashed;
  for (const auto& [id, name] : files) (IsCrashLog(name) ? crashed : ids).insert(id);
  std::set<uint64_t> kept = live;
  KeepHighest(ids, keep_, &kept);
  std::set<uint64_t> crash_kept;
  KeepHighest(crashed, crash_keep_, &crash_kept);
  for (const auto& [id, name] : files) {
    if ((IsCrashLog(name) ? crash_kept : kept).count(id) != 0) continue;
    if (::unlink((dir_ + "/" + name).c_str()) == 0) {
      ++deleted_;
    } else if (errno != ENOENT) {
      BATON_LOG(WARN, kLog) << ErrnoStatus("unlink " + dir_ + "/" + name, errno).message();
    }
  }
}

std::string EngineLogs::KeepCrashed(uint64_t id) {
  if (dir_.empty() || crash_keep_ == 0) return "";
  const std::string base = dir_ + "/engine-" + std::to_string(id);
  std::string kept;
  for (const char* copy : {"", ".1"}) {
    const std::string from = base + ".log" + copy;
    const std::string to = base + ".crash.log" + copy;
    if (::rename(from.c_str(), to.c_str()) == 0) {
      if (*copy == '\0') kept = to;
    } else if (errno != ENOENT) {
      BATON_LOG(WARN, kLog) << ErrnoStatus("rename " + from + " to " + to, errno).message();
    }
  }
  if (!kept.empty()) {
    BATON_LOG(INFO, kLog) << "engine " << id << " crashed: its log is kept as " << kept << " (the "
                          << crash_keep_ << " latest crashes' logs stay)";
  }
  return kept;
}

}  // namespace baton
