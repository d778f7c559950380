// Micro benchmark of an engine's launch (run with micro_bench.cc's by perf/micro_bench):
// ChildProcess::Spawn of /bin/true into an engine cgroup, the time the controller's event loop
// spends on a launch: the child made in the cgroup (clone3 with CLONE_INTO_CGROUP) or moving
// there through cgroup.procs, with 0 or 4 threads spinning beside it (a loaded host); one item
// is one spawn. Without engine cgroups (not root, no cgroup v2) the child stays in this
// process's cgroup, and the label says so. And EngineOwning, the controller's check of who says
// Hello: for a process of no engine (every rule read, its ancestry walked) and for an engine's
// process, among 4 engines.
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"
#include "controller/engines/child_process.h"
#include "controller/engines/engine_cgroup.h"
#include "controller/engines/peer_origin.h"

namespace baton {
namespace {

void BM_SpawnIntoCgroup(benchmark::State& state) {
  std::string why_not;
  Result<std::unique_ptr<EngineCgroups>> cgroups =
      EngineCgroups::Open("auto", "/micro-bench-" + std::to_string(::getpid()), &why_not);
  Result<std::shared_ptr<EngineCgroup>> cg = Unavailable("no engine cgroups: " + why_not);
  if (cgroups.ok() && *cgroups != nullptr) cg = (*cgroups)->Create(1);
  SpawnCgroup target;
  if (cg.ok()) {
    target = (*cg)->spawn_target();
    if (state.range(0) == 0) target.dir_fd = -1;  // moved through cgroup.procs
  } else {
    state.SetLabel("in no cgroup: " + cg.status().ToString());
  }
  std::atomic<bool> stop{false};
  std::vector<std::thread> hogs;
  for (int64_t i = 0; i < state.range(1); ++i) {
    hogs.emplace_back([&stop] {
      while (!stop.load(std::memory_order_relaxed)) {
      }
    });
  }
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    Result<ChildProcess> child = ChildProcess::Spawn({"/bin/true"}, {}, "", target);
    state.SetIterationTime(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    if (!child.ok()) {
      state.SkipWithError(child.status().ToString().c_str());
      break;
    }
    child->KillAndReap();
  }
  stop = true;
  for (std::thread& t : hogs) t.join();
  state.SetItemsProcessed(state.iterations());
}
// {made in the cgroup (1) or moved there (0), spinning threads}.
BENCHMARK(BM_SpawnIntoCgroup)
    ->Args({1, 0})
    ->Args({0, 0})
    ->Args({1, 4})
    ->Args({0, 4})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// Arg: 0, the benchmark's own process (an engine of none); 1, the last engine's process.
void BM_EngineOwning(benchmark::State& state) {
  std::string why_not;
  Result<std::unique_ptr<EngineCgroups>> cgroups =
      EngineCgroups::Open("auto", "/micro-bench-owning-" + std::to_string(::getpid()), &why_not);
  const bool with_cgroups = cgroups.ok() && *cgroups != nullptr;
  std::vector<std::shared_ptr<EngineCgroup>> cgs;
  std::vector<ChildProcess> children;
  std::vector<EngineProcesses> engines;
  for (uint64_t id = 1; id <= 4; ++id) {
    SpawnCgroup target;
    if (with_cgroups) {
      Result<std::shared_ptr<EngineCgroup>> cg = (*cgroups)->Create(id);
      if (cg.ok()) cgs.push_back(*cg), target = cgs.back()->spawn_target();
    }
    Result<ChildProcess> child = ChildProcess::Spawn({"sleep", "600"}, {}, "", target);
    if (!child.ok()) return state.SkipWithError(child.status().ToString().c_str());
    engines.push_back(
        {.id = id, .leader = child->pid(), .cgroup = target.dir_fd >= 0 ? cgs.back()->path() : ""});
    children.push_back(std::move(child).value());
  }
  if (!with_cgroups) state.SetLabel("no engine cgroups: " + why_not);
  const pid_t pid = state.range(0) == 0 ? ::getpid() : children.back().pid();
  for (auto _ : state) {
    const std::optional<uint64_t> owner = EngineOwning(pid, engines);
    if (owner.has_value() != (state.range(0) == 1)) {
      state.SkipWithError("EngineOwning placed the process wrongly");
      break;
    }
  }
  for (ChildProcess& c : children) c.KillAndReap();
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_EngineOwning)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace baton
