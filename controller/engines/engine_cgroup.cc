#include "controller/engines/engine_cgroup.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "base/io/small_file.h"
#include "base/log.h"

namespace baton {
namespace {

constexpr char kLog[] = "cgroup";

// Enough for the cgroup.procs of an engine with thousands of processes.
constexpr size_t kCgroupFileLimit = size_t{1} << 20;

Result<std::string> ReadCgroupFile(const std::string& path) {
  return ReadSmallFile(path, kCgroupFileLimit);
}

Status WriteCgroupFile(const std::string& path, const std::string& text) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  if (!fd) return ErrnoStatus("opening " + path, errno);
  return WriteAll(fd.get(), text, path);
}

bool IsPopulated(const std::string& dir) {
  Result<std::string> events = ReadCgroupFile(dir + "/cgroup.events");
  if (!events.ok()) return ::access(dir.c_str(), F_OK) == 0;
  return events->find("populated 1") != std::string::npos;
}

std::vector<pid_t> ReadMembers(const std::string& dir) {
  std::vector<pid_t> pids;
  Result<std::string> procs = ReadCgroupFile(dir + "/cgroup.procs");
  if (!procs.ok()) return pids;
  std::istringstream in(*procs);
  long pid = 0;
  while (in >> pid) pids.push_back(static_cast<pid_t>(pid));
  return pids;
}

// Removes the cgroup `dir`, trying again every millisecond while it is busy (members still
// exiting, a cgroup below it going) until `until`.
Status RemoveWhenEmpty(const std::string& dir, std::chrono::steady_clock::time_point until) {
  while (true) {
    int err = EBUSY;
    if (!IsPopulated(dir)) {
      if (::rmdir(dir.c_str()) == 0 || errno == ENOENT) return OkStatus();
      err = errno;
    }
    if (err != EBUSY || std::chrono::steady_clock::now() >= until) {
      return ErrnoStatus(
          "removing " + dir + " (" + std::to_string(ReadMembers(dir).size()) + " members left)",
          err);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Kills every member of `dir`, waits up to `wait` for them to go, removes it. `killed` gets
// the number of members found.
Status KillAndRemove(const std::string& dir, std::chrono::milliseconds wait, size_t* killed) {
  const std::vector<pid_t> members = ReadMembers(dir);
  if (killed != nullptr) *killed = members.size();
  if (IsPopulated(dir)) BATON_RETURN_IF_ERROR(WriteCgroupFile(dir + "/cgroup.kill", "1"));
  return RemoveWhenEmpty(dir, std::chrono::steady_clock::now() + wait);
}

// Kills what is left in `dir` and removes it if its members are gone, without waiting.
// Returns false while it must be tried again (members still exiting, or a cgroup below it).
bool TryRemove(const std::string& dir) {
  if (IsPopulated(dir)) {
    if (Status killed = WriteCgroupFile(dir + "/cgroup.kill", "1"); !killed.ok()) {
      if (::access(dir.c_str(), F_OK) != 0) return true;  // gone meanwhile
      BATON_LOG(WARN, kLog) << killed.ToString();
    }
    return false;
  }
  if (::rmdir(dir.c_str()) == 0 || errno == ENOENT) return true;
  if (errno == EBUSY) return false;
  BATON_LOG(WARN, kLog) << ErrnoStatus("removing " + dir, errno).ToString();
  return true;
}

// FNV-1a: a stable name for a runtime directory.
std::string Key(const std::string& text) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  char out[17];
  std::snprintf(out, sizeof(out), "%016llx", static_cast<unsigned long long>(h));
  return out;
}

std::vector<std::string> Split(const std::string& line) {
  std::vector<std::string> fields;
  std::istringstream in(line);
  std::string f;
  while (in >> f) fields.push_back(f);
  return fields;
}

// Where the cgroup2 hierarchy is mounted here, and which of its directories the mount shows
// as its root; read from /proc/self/mountinfo once (mounts do not move under a daemon).
struct Cgroup2Mount {
  std::string mount;
  std::string root;
};
const Cgroup2Mount& TheCgroup2Mount() {
  static const Cgroup2Mount found = [] {
    Cgroup2Mount m;
    std::ifstream mounts("/proc/self/mountinfo");
    for (std::string line; m.mount.empty() && std::getline(mounts, line);) {
      const std::vector<std::string> f = Split(line);
      for (size_t i = 6; i + 1 < f.size(); ++i) {
        if (f[i] == "-" && f[i + 1] == "cgroup2") m = {.mount = f[4], .root = f[3]};
      }
    }
    return m;
  }();
  return found;
}

// The cgroup2 directory that `cgroup_file` (a /proc/PID/cgroup) names, as this process's mount
// names it; "" when there is none.
std::string Cgroup2DirIn(const std::string& cgroup_file) {
  const std::string& mount = TheCgroup2Mount().mount;
  const std::string& root = TheCgroup2Mount().root;
  if (mount.empty()) return "";
  std::string own;
  std::ifstream cgroups(cgroup_file);
  for (std::string line; std::getline(cgroups, line);) {
    if (line.rfind("0::", 0) == 0) own = line.substr(3);
  }
  if (own.empty() || own.find(" (deleted)") != std::string::npos) return "";
  if (root != "/" && own.rfind(root, 0) == 0) own = own.substr(root.size());
  if (own.empty() || own == "/") return mount;
  return mount + own;
}

}  // namespace

std::string OwnCgroup2Dir() { return Cgroup2DirIn("/proc/self/cgroup"); }

std::string Cgroup2DirOf(pid_t pid) {
  return Cgroup2DirIn("/proc/" + std::to_string(pid) + "/cgroup");
}

RetiredCgroups::~RetiredCgroups() {
  for (const Entry& e : entries_) {
    if (Status removed = KillAndRemove(e.path, std::chrono::milliseconds(200), nullptr);
        !removed.ok()) {
      BATON_LOG(WARN, kLog) << removed.ToString();
    }
  }
  if (base_.empty()) return;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  if (Status removed = RemoveWhenEmpty(base_, until); !removed.ok()) {
    BATON_LOG(WARN, kLog) << removed.ToString() << "; left for the next start";
  }
}

void RetiredCgroups::Retire(const std::string& path) {
  if (!TryRemove(path)) entries_.push_back(Entry{path});
}

size_t RetiredCgroups::Sweep() {
  std::erase_if(entries_, [](Entry& e) {
    if (TryRemove(e.path)) return true;
    if (++e.sweeps < kMaxSweeps) return false;
    BATON_LOG(WARN, kLog) << e.path << " is still in use " << kMaxSweeps
                          << " sweeps after its engine went; left for the next start";
    return true;
  });
  return entries_.size();
}

EngineCgroup::~EngineCgroup() {
  if (retired_ != nullptr) retired_->Retire(path_);
}

Status EngineCgroup::Kill() {
  Status s = WriteCgroupFile(path_ + "/cgroup.kill", "1");
  if (!s.ok() && ::access(path_.c_str(), F_OK) != 0) return OkStatus();  // already gone
  return s;
}

Status EngineCgroup::Freeze() { return WriteCgroupFile(path_ + "/cgroup.freeze", "1"); }

bool EngineCgroup::Frozen() const {
  Result<std::string> events = ReadCgroupFile(path_ + "/cgroup.events");
  return events.ok() && events->find("frozen 1") != std::string::npos;
}

bool EngineCgroup::Populated() const { return IsPopulated(path_); }

std::vector<pid_t> EngineCgroup::Members() const { return ReadMembers(path_); }

double EngineCgroup::CpuSeconds() const {
  Result<std::string> stat = ReadCgroupFile(path_ + "/cpu.stat");
  if (!stat.ok()) return -1;
  std::istringstream in(*stat);
  std::string key;
  uint64_t value = 0;
  while (in >> key >> value) {
    if (key == "usage_usec") return static_cast<double>(value) / 1e6;
  }
  return -1;
}

Status EngineCgroups::CheckSetting(const std::string& setting) {
  if (setting == "auto" || setting == "off" || (!setting.empty() && setting[0] == '/')) {
    return OkStatus();
  }
  return InvalidArgument("engine.cgroup: want \"auto\", \"off\" or an absolute path, got \"" +
                         setting + "\"");
}

Result<std::unique_ptr<EngineCgroups>> EngineCgroups::Open(const std::string& setting,
                                                           const std::string& runtime_dir,
                                                           std::string* why_not) {
  BATON_RETURN_IF_ERROR(CheckSetting(setting));
  if (setting == "off") return std::unique_ptr<EngineCgroups>();
  const bool automatic = setting == "auto";
  auto refuse = [&](const std::string& why) -> Result<std::unique_ptr<EngineCgroups>> {
    if (!automatic) return FailedPrecondition("engine.cgroup " + setting + ": " + why);
    *why_not = why;
    return std::unique_ptr<EngineCgroups>();
  };
  std::string base = setting;
  if (automatic) {
    const std::string own = OwnCgroup2Dir();
    if (own.empty()) return refuse("no cgroup v2 hierarchy is mounted");
    base = own + "/baton-" + Key(runtime_dir);
  }
  const bool made = ::mkdir(base.c_str(), 0755) == 0;
  if (!made && errno != EEXIST) {
    return refuse(ErrnoStatus("making " + base, errno).message());
  }
  std::unique_ptr<EngineCgroups> c(new EngineCgroups(base, made || automatic));
  if (::access((base + "/cgroup.kill").c_str(), W_OK) != 0) {
    return refuse(base +
                  "/cgroup.kill is missing or not writable (Linux 5.14 or newer and a "
                  "delegated cgroup are needed)");
  }
  return c;
}

EngineCgroups::~EngineCgroups() {
  if (owned_) retired_->RemoveLast(base_);  // after the engine cgroups still held or retired
}

void EngineCgroups::ClearLeftovers(const std::set<uint64_t>& keep) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(base_, ec)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_directory() || name.rfind("engine-", 0) != 0) continue;
    uint64_t id = 0;
    if (std::sscanf(name.c_str(), "engine-%" SCNu64, &id) == 1 && keep.count(id) != 0) continue;
    size_t killed = 0;
    const Status removed = KillAndRemove(entry.path().string(), std::chrono::seconds(2), &killed);
    leftovers_killed_ += killed;
    if (!removed.ok()) {  // an engine of that id will be refused its cgroup, not the others
      BATON_LOG(WARN, kLog) << "leftover cgroup: " << removed.ToString();
    }
    if (killed > 0) {
      BATON_LOG(WARN, kLog) << "killed " << killed << " processes left in " << entry.path().string()
                            << " by an earlier controller's engine";
    }
  }
  if (ec) BATON_LOG(WARN, kLog) << "listing " << base_ << ": " << ec.message();
}

Result<std::shared_ptr<EngineCgroup>> EngineCgroups::Adopt(const std::string& path) {
  if (path.rfind(base_ + "/engine-", 0) != 0) {
    return InvalidArgument("cgroup " + path + " is not an engine cgroup under " + base_);
  }
  if (::access((path + "/cgroup.kill").c_str(), W_OK) != 0) {
    return ErrnoStatus("adopting cgroup " + path, errno);
  }
  return std::make_shared<EngineCgroup>(path, UniqueFd(), UniqueFd(), retired_);
}

Status EngineCgroups::MakeEngineDir(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) == 0) return OkStatus();
  int err = errno;
  // The base, this controller's own, was removed while it ran (by hand, or by a tool that
  // prunes empty cgroups): made again, or no engine could launch until the next start.
  if (err == ENOENT && owned_ && ::mkdir(base_.c_str(), 0755) == 0) {
    BATON_LOG(WARN, kLog) << "cgroup base " << base_
                          << " was removed while this controller ran: made again";
    if (::mkdir(path.c_str(), 0755) == 0) return OkStatus();
    err = errno;
  }
  return ErrnoStatus("making cgroup " + path, err);
}

Result<std::shared_ptr<EngineCgroup>> EngineCgroups::Create(uint64_t engine_id) {
  const std::string path = base_ + "/engine-" + std::to_string(engine_id);
  if (::access(path.c_str(), F_OK) == 0) {
    BATON_RETURN_IF_ERROR(KillAndRemove(path, std::chrono::seconds(1), nullptr));
  }
  BATON_RETURN_IF_ERROR(MakeEngineDir(path));
  UniqueFd dir(::open(path.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  const int dir_errno = errno;
  UniqueFd procs(::open((path + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC));
  if (!dir || !procs) {
    const int err = !dir ? dir_errno : errno;
    ::rmdir(path.c_str());
    return ErrnoStatus("opening " + path + (dir ? "/cgroup.procs" : ""), err);
  }
  return std::make_shared<EngineCgroup>(path, std::move(dir), std::move(procs), retired_);
}

}  // namespace baton
