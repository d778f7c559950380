// EngineCgroup and EngineCgroups: a cgroup v2 directory per engine, so that a fence reaches
// every process an engine started, including one that left its process group (`setsid`, a
// daemonized worker), and so that the barrier knows when the last of them is gone.
//
// Layout: <base>/engine-<id>. With the setting "auto", base is
// "<cgroup2 mount><the controller's own cgroup>/baton-<key>", where key names the controller's
// runtime directory (one controller per runtime directory); otherwise base is the configured
// directory. The child joins its cgroup between fork and exec by writing "0" to the
// cgroup.procs descriptor opened here (ChildProcess::Spawn), before any engine code runs, so
// nothing the engine starts is outside it. No controller is enabled in base's
// cgroup.subtree_control: the cgroups only group, they limit nothing.
//
// Kill() writes "1" to cgroup.kill (Linux 5.14): the kernel sends SIGKILL to every member,
// forks in flight included. Populated() reads cgroup.events: zombies do not count (a zombie
// holds no memory). Both are plain file writes and reads (a few µs), fit for the io thread.
//
// RAII: ~EngineCgroup kills what is left and hands the directory to RetiredCgroups, which
// removes it at once when its members are gone and otherwise on a later Sweep: nothing waits
// for a process to exit on the thread that let the cgroup go. Base is removed once
// EngineCgroups and every EngineCgroup are gone, after the engine cgroups under it (the
// RetiredCgroups they share goes last). A
// controller restarted on the same runtime directory finds the engine-* cgroups of the engines it
// re-adopts (Adopt) and kills and removes every other one an earlier controller left behind
// (ClearLeftovers; one that cannot be removed is logged, and only an engine of its id is refused a
// cgroup).
//
// Thread: io_context thread only.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "base/io/unique_fd.h"
#include "base/status.h"
#include "controller/engines/spawn_cgroup.h"

namespace baton {

// The cgroups of engines that are gone, until their directories could be removed. Each call
// is a few file operations and never waits.
class RetiredCgroups {
 public:
  // Sweeps before a cgroup still populated is given up (logged; the next controller's
  // ClearLeftovers removes it): 5 s at the controller's 10 ms sweep period.
  static constexpr int kMaxSweeps = 500;

  RetiredCgroups() = default;
  // The last removals (shutdown): waits up to 200 ms for each cgroup's members to go, then
  // up to 200 ms for the base (RemoveLast) to empty; what cannot be removed is logged (WARN,
  // naming it) and left for the next controller's ClearLeftovers.
  ~RetiredCgroups();
  RetiredCgroups(const RetiredCgroups&) = delete;
  RetiredCgroups& operator=(const RetiredCgroups&) = delete;

  // Kills what is left in the cgroup `path` and removes it if nothing is left; otherwise
  // keeps it for Sweep.
  void Retire(const std::string& path);
  // Tries each kept cgroup once more. Returns how many are still kept.
  size_t Sweep();
  size_t pending() const { return entries_.size(); }
  // The directory above the retired cgroups (EngineCgroups' base), removed by the destructor
  // after them: once the last EngineCgroup and the EngineCgroups that share this set are gone.
  void RemoveLast(std::string base) { base_ = std::move(base); }

 private:
  struct Entry {
    std::string path;
    int sweeps = 0;
  };
  std::vector<Entry> entries_;
  std::string base_;
};

class EngineCgroup {
 public:
  EngineCgroup(std::string path, UniqueFd dir, UniqueFd procs,
               std::shared_ptr<RetiredCgroups> retired)
      : path_(std::move(path)),
        dir_(std::move(dir)),
        procs_(std::move(procs)),
        retired_(std::move(retired)) {}
  ~EngineCgroup();
  EngineCgroup(const EngineCgroup&) = delete;
  EngineCgroup& operator=(const EngineCgroup&) = delete;

  const std::string& path() const { return path_; }
  // cgroup.procs opened for writing: a child writes "0" to it to join.
  int procs_fd() const { return procs_.get(); }
  // Where ChildProcess::Spawn starts an engine: made in the directory, or migrated through
  // cgroup.procs on a kernel that cannot (SpawnCgroup).
  SpawnCgroup spawn_target() const { return {.dir_fd = dir_.get(), .procs_fd = procs_.get()}; }
  // SIGKILL to every member (cgroup.kill).
  Status Kill();
  // Freezes every member, present and future (cgroup.freeze): they stop where they are, as a
  // whole engine that hangs would, until killed (a fatal signal still ends a frozen process).
  // For the hang drill.
  Status Freeze();
  // True once every member is frozen (cgroup.events: "frozen 1").
  bool Frozen() const;
  // True while a member that is not a zombie is left (also when cgroup.events cannot be read
  // while the directory exists: the barrier then waits for its deadline).
  bool Populated() const;
  // The members' pids (cgroup.procs); empty on error.
  std::vector<pid_t> Members() const;
  // CPU time used by every process of the cgroup, the dead included (cpu.stat usage_usec,
  // present without any controller enabled); -1 when it cannot be read.
  double CpuSeconds() const;
  // The cgroup and its members outlive this handle: neither killed nor removed (a controller
  // that cannot start leaves a running engine to the next one).
  void Leave() { retired_.reset(); }

 private:
  std::string path_;
  UniqueFd dir_;
  UniqueFd procs_;
  std::shared_ptr<RetiredCgroups> retired_;
};

class EngineCgroups {
 public:
  // `setting`: "off" -> nullptr (process groups only); "auto" -> under the controller's own
  // cgroup, or nullptr with `*why_not` set when cgroup v2 cannot be used here (no cgroup2
  // mount, no cgroup.kill, no permission); an absolute path -> that directory, which must
  // work (an error otherwise). `runtime_dir` gives the key of "auto".
  static Result<std::unique_ptr<EngineCgroups>> Open(const std::string& setting,
                                                     const std::string& runtime_dir,
                                                     std::string* why_not);
  // InvalidArgument unless `setting` is one Open takes: "auto", "off" or an absolute path.
  static Status CheckSetting(const std::string& setting);
  ~EngineCgroups();
  EngineCgroups(const EngineCgroups&) = delete;
  EngineCgroups& operator=(const EngineCgroups&) = delete;

  // Makes <base>/engine-<id> (a leftover of that name is killed and removed first). A base
  // that Open made or chose ("auto") and that was removed since is made again first.
  Result<std::shared_ptr<EngineCgroup>> Create(uint64_t engine_id);
  // The cgroup `path` (an engine-* directory under base) of an engine a previous controller
  // launched; its members are not touched.
  Result<std::shared_ptr<EngineCgroup>> Adopt(const std::string& path);
  // Kills and removes every engine-* cgroup under base but those of the engines in `keep`.
  void ClearLeftovers(const std::set<uint64_t>& keep);

  const std::string& base() const { return base_; }
  // The base directory stays on destruction (engine cgroups were left in it).
  void Leave() { owned_ = false; }
  // Processes found and killed in leftover cgroups when this was opened.
  size_t leftovers_killed() const { return leftovers_killed_; }
  // The cgroups of gone engines whose removal waits for their members to exit: the owner
  // calls Sweep() on them (every 10 ms while any is pending).
  RetiredCgroups& retired() { return *retired_; }

 private:
  EngineCgroups(std::string base, bool owned)
      : base_(std::move(base)), owned_(owned), retired_(std::make_shared<RetiredCgroups>()) {}
  Status MakeEngineDir(const std::string& path);

  std::string base_;
  bool owned_;  // made by Open: removed on destruction
  std::shared_ptr<RetiredCgroups> retired_;
  size_t leftovers_killed_ = 0;
};

// The cgroup2 directory the calling process belongs to ("" when there is none), from
// /proc/self/mountinfo and /proc/self/cgroup.
std::string OwnCgroup2Dir();
// The cgroup2 directory of process `pid` as this process's mount names it ("" when there is
// none, or the process is gone), from /proc/self/mountinfo and /proc/PID/cgroup.
std::string Cgroup2DirOf(pid_t pid);

}  // namespace baton
