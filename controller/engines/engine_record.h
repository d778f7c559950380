// EngineRecord: everything the controller holds about one engine process, from launch until
// it is reaped and its blocks have moved.
//
// The record owns the child (pidfd), the Asio descriptor that watches the pidfd, the control
// channel once the engine has said Hello with its launch token, the engine's state machine
// and, once registered, its failure detector. FailCause says why an engine is being fenced.
//
// Ownership: the Controller owns every record (by engine id). Thread: io_context thread only.
#pragma once

#include <boost/asio/posix/stream_descriptor.hpp>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/clock.h"
#include "controller/core/failure_detector.h"
#include "controller/core/pair_state.h"
#include "controller/core/pool_ledger.h"
#include "controller/engines/engine_cgroup.h"
#include "controller/engines/supervisor.h"
#include "proto/transport/channel.h"

namespace baton {

enum class FailCause {
  kDied,        // the pidfd became readable
  kEof,         // the control connection closed or broke (a bad frame)
  kHung,        // missed heartbeats, no answer to the health request
  kError,       // the engine's SDK reported an asynchronous error
  kStale,       // it sent a stale epoch (told to stop)
  kTimeout,     // it did not register / acknowledge a promotion in time
  kMisbehaved,  // it broke the lifecycle protocol (wrong engine id, ...)
  kPlanned,     // drained for a switch-over or a drain
  kShutdown,    // the controller is stopping
};
const char* ToString(FailCause cause);

// Ledger extents as the protocol's block ranges (Promote, Grant).
inline std::vector<proto::BlockRange> ToRanges(const std::vector<Extent>& extents) {
  std::vector<proto::BlockRange> out;
  for (const Extent& e : extents) out.push_back(proto::BlockRange{e.first, e.count});
  return out;
}

struct EngineRecord {
  EngineRecord(EngineId engine_id, const Clock& clock)
      : id(engine_id), machine(NewEngineMachine(engine_id, clock)) {}

  EngineId id;
  std::string launch_role;  // "primary" or "standby": what it was launched as
  std::string token;
  int port = 0;
  // The engine's cgroup (null when cgroups are off): declared before `process`, so that the
  // leader is reaped before the cgroup kills what is left and is removed. Shared with the
  // barrier, which waits for it to empty.
  std::shared_ptr<EngineCgroup> cgroup;
  ChildProcess process;
  // The members of the engine's process group when it was fenced (CUDA backend only: the
  // barrier asks NVML about each of them, dead ones included).
  std::vector<pid_t> group_pids;
  std::unique_ptr<boost::asio::posix::stream_descriptor> pid_watch;
  EngineMachine machine;

  std::unique_ptr<proto::Channel> channel;
  uint64_t channel_gen = 0;  // distinguishes callbacks of a replaced channel
  bool registered = false;   // Register received and acknowledged
  std::optional<FailureDetector> detector;
  uint64_t heartbeats = 0;
  uint64_t probes = 0;
  TimePoint last_heartbeat{};

  std::vector<std::string> command;  // the command line it was launched with (unexpanded)
  std::string version;
  std::string http_address;
  uint64_t prefault_us = 0;
  std::string device_memory;  // CUDA backend: "mapped", or why the engine declined it
  TimePoint launched_at{};
  std::optional<TimePoint> ready_at;  // StandbyReady
  std::optional<TimePoint> deadline;  // register, promote or drain deadline for its state
  bool serving = false;               // PromoteAck received and not draining
  uint32_t called_off_drains = 0;     // Drains called off (Resume sent) whose Drained is due

  std::optional<FailCause> failed;
  std::string fail_reason;

  bool is(EngineState s) const { return machine.state() == s; }
  // Launched, registering, standby, promoting, primary or draining: not being fenced.
  bool live() const { return !failed.has_value(); }
};

}  // namespace baton
