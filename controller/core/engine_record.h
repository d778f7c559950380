// EngineRecord: what the Coordinator knows of one engine, from launch (or adoption from a
// previous controller) until it is reaped and its blocks have moved. Plain data: the process,
// its connection and its cgroup belong to the daemon (controller/engines/engine_handle.h).
//
// The engine's state machine is its state: whether it is registered, serving or being fenced
// is read from `machine`, never kept beside it. FailCause says why an engine is fenced.
//
// Ownership: the Coordinator owns every record (by engine id). Thread: the Coordinator's.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/clock.h"
#include "controller/core/failure_detector.h"
#include "controller/core/pair_state.h"
#include "controller/core/pool_ledger.h"
#include "controller/core/progress_watch.h"
#include "proto/messages.h"

namespace baton {

enum class FailCause {
  kDied,         // the process exited
  kEof,          // the control connection closed or broke (a bad frame)
  kHung,         // missed heartbeats and no answer to the health request, or its compute
                 // stood still (its own progress reports, or a router's EngineStalled)
  kError,        // the engine's SDK reported an asynchronous error
  kStale,        // it sent a stale epoch (told to stop)
  kTimeout,      // it did not register / acknowledge a promotion in time
  kMisbehaved,   // it broke the lifecycle protocol (wrong engine id, ...)
  kPlanned,      // drained for a switch-over or a drain
  kShutdown,     // the controller is stopping, or replaced it (an upgrade's standby)
  kUnaccounted,  // a restarted controller could not account for it (roster, journal, token)
};
const char* ToString(FailCause cause);

// Ledger extents as the protocol's block ranges (Promote, Grant), and back.
std::vector<proto::BlockRange> ToRanges(const std::vector<Extent>& extents);
std::vector<Extent> ToExtents(const std::vector<proto::BlockRange>& ranges);
uint32_t BlocksIn(const std::vector<Extent>& extents);

struct EngineRecord {
  EngineRecord(EngineId engine_id, const Clock& clock, bool adopted_from_previous)
      : id(engine_id),
        machine(adopted_from_previous ? AdoptedEngineMachine(engine_id, clock)
                                      : NewEngineMachine(engine_id, clock)),
        adopted(adopted_from_previous) {}

  EngineId id;
  proto::LaunchRole launch_role = proto::LaunchRole::kStandby;  // what it was launched as
  std::string token;
  int port = 0;
  pid_t pid = 0;
  std::vector<std::string> command;  // the command line it was launched with (unexpanded)
  EngineMachine machine;
  bool adopted;  // launched by a previous controller

  bool connected = false;  // a channel with Hello accepted is open
  uint16_t protocol = 0;   // the version that channel speaks
  std::optional<FailureDetector> detector;
  uint64_t heartbeats = 0;
  uint64_t probes = 0;
  TimePoint last_heartbeat{};
  // From its first Progress, when compute_stall_timeout is set.
  std::optional<ProgressWatch> progress;

  std::string version;
  std::string http_address;
  uint64_t prefault_us = 0;
  std::string device_memory;  // CUDA backend: "mapped", or why the engine declined it
  TimePoint launched_at{};
  std::optional<TimePoint> ready_at;  // StandbyReady
  std::optional<TimePoint> deadline;  // register, promote, drain or re-registration deadline
  // A re-adopted canary's PromoteAck (its epoch) that came while the recovery still waited:
  // acted on when the upgrade resumes (RecoveryPart::HoldsCanary).
  std::optional<uint64_t> held_promote_ack;
  uint32_t called_off_drains = 0;  // Drains called off (Resume sent) whose Drained is due

  std::optional<FailCause> fail_cause;
  std::string fail_reason;

  EngineState state() const { return machine.state(); }
  bool is(EngineState s) const { return machine.state() == s; }
  // Not being fenced (launching, registering, adopting, standby, promoting, primary, draining).
  bool live() const { return !is(EngineState::kFencing) && !is(EngineState::kDead); }
  // Register (or Reattach) accepted.
  bool registered() const { return !is(EngineState::kLaunching) && !is(EngineState::kAdopting); }
  // Serving traffic: promoted, acknowledged, and not draining.
  bool serving() const { return is(EngineState::kPrimary); }
};

}  // namespace baton
