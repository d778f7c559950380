// SpawnCgroup: where ChildProcess::Spawn (child_process.h) makes a child, as EngineCgroup
// (engine_cgroup.h) hands it over.
#pragma once

namespace baton {

// The cgroup a spawned child starts in. With `dir_fd` (the cgroup v2 directory) the child is
// made in it (clone3 with CLONE_INTO_CGROUP, Linux 5.7): no migration, which would take the
// kernel's cgroup_threadgroup_rwsem for writing and wait for an RCU grace period. `procs_fd`
// (cgroup.procs open for writing) is that migration, done by the child before its exec, where
// clone3 is refused (a kernel before 5.7, a seccomp profile). Both -1: the child stays in the
// caller's cgroup.
struct SpawnCgroup {
  int dir_fd = -1;
  int procs_fd = -1;
};

}  // namespace baton
