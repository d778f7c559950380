// Effects: the one narrow interface through which the Coordinator acts on the world.
//
// The Coordinator (coordinator.h) decides; every decision that touches a process, a socket,
// a file, a cgroup, NVML or the GPU is one call here, made in the order the fencing rules
// require (kill before fence, a durable epoch before the grant that carries it, the barrier
// before blocks move). The daemon implements it over real processes and channels
// (controller/controller_effects.cc); the randomized simulation implements it over its model
// of the world (tests/controller/sim_effects.h). Nothing here calls back into the
// Coordinator: what happens later (an exit, a reply, a send that failed after being queued)
// comes back as an event.
//
// Thread: the caller's (the controller's io_context thread). Implementations may block only
// for the journal's fsync and a short reap.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "base/status.h"
#include "controller/core/command_record.h"
#include "controller/core/drill_kind.h"
#include "controller/core/pool_ledger.h"
#include "controller/core/roster.h"
#include "proto/messages.h"

namespace baton {

// What the controller sends an engine. RegisterAck is built by the daemon (it holds the
// weights, the pool and the device memory whose fds go with it).
struct SendRegisterAck {};
using ToEngine =
    std::variant<SendRegisterAck, proto::Promote, proto::Grant, proto::Reclaim, proto::Drain,
                 proto::Resume, proto::Stop, proto::ErrorMsg, proto::HealthRequest,
                 proto::InjectFault, proto::ReattachAck, proto::Quarantined, proto::FinalDrain>;
// "Promote", "Grant", ... for logs.
const char* ToEngineName(const ToEngine& message);

struct LaunchSpec {
  EngineId id = kNoEngine;
  proto::LaunchRole role = proto::LaunchRole::kStandby;  // what it is launched as
  std::string token;
  int port = 0;
  std::vector<std::string> command;  // unexpanded (placeholders)
};

class Effects {
 public:
  virtual ~Effects() = default;

  // --- processes ----------------------------------------------------------------------------
  // A new random launch token (128 bits, hex).
  virtual Result<std::string> NewToken() = 0;
  // Starts the engine process; returns its pid. The engine's exit comes back as
  // Coordinator::OnExited.
  virtual Result<pid_t> Launch(const LaunchSpec& spec) = 0;
  // Whether Launch could start `command`'s program here (an upgrade's candidate, checked
  // before the standby makes way for it): FailedPrecondition naming the program and why not.
  virtual Status CheckCommand(const std::vector<std::string>& command) = 0;
  // SIGKILL to the engine, its process group and its cgroup; closes its connection. Returns
  // whether it was still running. Idempotent.
  virtual bool Kill(EngineId id) = 0;
  // Whether the engine's death is known here though not yet given to the Coordinator (its
  // liveness page seen to die, its process exited, its connection closed by the peer): an
  // engine that died together with another (kill -9 of both) is then not relied upon while
  // the other's death is handled. Does not block.
  virtual bool Dying(EngineId id) = 0;
  // Asks an engine that cannot be told to stop (no connection) to exit: SIGTERM.
  virtual void Terminate(EngineId id) = 0;
  // Makes the primary misbehave as `kind` asks (kill: SIGKILL without a fence; hang: freeze
  // it; error: ask its SDK to report one). Returns how, for the log (" by freezing its
  // cgroup").
  virtual Result<std::string> Drill(EngineId id, DrillKind kind) = 0;
  // What still holds a reaped engine's barrier (another process of its group or cgroup
  // alive, NVML listing one of them on the GPU), or "" once it has passed.
  virtual std::string BarrierHeldBy(EngineId id) = 0;
  // The Coordinator no longer needs anything of engine `id` (its process is reaped and past
  // the barrier, or was never started): its handles may go.
  virtual void Release(EngineId id) = 0;

  // --- channels -----------------------------------------------------------------------------
  // Sends on the engine's connection. An error means it could not be sent (no connection,
  // or the engine stopped reading): the Coordinator fences the engine.
  virtual Status Send(EngineId id, const ToEngine& message) = 0;
  // Closes the engine's connection (a refused re-registration, a fenced engine).
  virtual void Disconnect(EngineId id) = 0;
  // Publishes the route table to every router; false when it equals the last one.
  virtual bool PublishRoutes(proto::RouteTable table) = 0;
  // What the routers saw of each engine (summed), and how many routers it is heard from:
  // those subscribed to the socket, and a fleet's routers reporting through etcd.
  virtual std::map<uint64_t, proto::EngineOutcome> RouterOutcomes() const = 0;
  virtual size_t RouterCount() const = 0;

  // --- state on disk ------------------------------------------------------------------------
  // The roster: the engines this controller runs, what each holds, at which epoch. Written
  // before anything it lists is sent (a grant, a promotion, a launch token), so that a
  // restarted controller knows at least what any engine may hold.
  virtual Status SaveRoster(const Roster& roster) = 0;
  virtual Status SaveCommandRecord(const CommandRecord& record) = 0;

  // --- the CUDA backend's device memory -----------------------------------------------------
  // True while device memory exists (always true on the host backend).
  virtual bool DeviceMemoryPresent() const = 0;
  // OK while the device works; the reason it is lost otherwise.
  virtual Status ProbeDevice() = 0;
  // Forgets the lost device memory, then makes it again from the pinned host cache.
  virtual void DropDevice() = 0;
  virtual Status RebuildDevice() = 0;
};

}  // namespace baton
