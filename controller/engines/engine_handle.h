// EngineHandle: what the daemon holds of one engine process for the Coordinator: the process
// (its pidfd: a child this controller launched, or a previous controller's engine it
// adopted), the Asio descriptor that watches the pidfd, the engine's cgroup, its control
// channel once the engine has said Hello with its launch token, and the watch on its liveness
// page once StandbyReady (or Reattach) brought one.
//
// The Coordinator decides (controller/core/coordinator.h); the daemon keeps a handle from
// Launch (or adoption) until Effects::Release, which comes once the process has exited and
// passed the barrier. Ownership: the Controller owns every handle (by engine id). Thread:
// io_context thread only.
#pragma once

#include <sys/types.h>

#include <boost/asio/posix/stream_descriptor.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "controller/engines/child_process.h"
#include "controller/engines/engine_cgroup.h"
#include "proto/transport/channel.h"
#include "proto/transport/liveness_page.h"

namespace baton {

struct EngineHandle {
  uint64_t id = 0;
  // Declared before `process`, so that the leader is reaped before the cgroup kills what is
  // left and is removed. Null when cgroups are off.
  std::shared_ptr<EngineCgroup> cgroup;
  ChildProcess process;     // empty (pid 0) for an adopted engine found gone
  pid_t pid = 0;            // kept after the process is reaped: its process group id
  uint64_t start_time = 0;  // /proc/<pid>/stat, for the roster
  // The members of the engine's process group and cgroup when it was killed (CUDA backend:
  // the barrier asks NVML about each of them, dead ones included).
  std::vector<pid_t> group_pids;
  std::unique_ptr<boost::asio::posix::stream_descriptor> pid_watch;
  std::unique_ptr<proto::Channel> channel;
  uint64_t channel_gen = 0;   // distinguishes callbacks of a replaced channel
  bool exited = false;        // its exit was given to the Coordinator
  std::string device_memory;  // "mapped" once it took the device regions (for NVML's check)
  // Sees the engine's process die before its connection ends (proto/transport/liveness_page.h).
  std::unique_ptr<proto::LivenessWatch> liveness;
  std::unique_ptr<boost::asio::posix::stream_descriptor> liveness_wait;  // on a dup of its fd
};

}  // namespace baton
