// The engine's compute progress (protocol 11): what its own loop says it has done, so that
// the controller finds a compute that hangs while the heartbeat thread goes on. Part of
// proto/messages.h, which includes it where these types are needed; include that header, not
// this one.
#pragma once

#include <cstdint>

namespace baton::proto {

// Engine -> controller (protocol 11 and up), with each Heartbeat once the engine has reported
// progress (EngineSession::ReportProgress): `steps_done` counts the compute steps it finished
// (never goes back within a process), `work_pending` the requests it admitted and has not
// finished. An engine that never reports sends none. `epoch` as in Heartbeat.
struct Progress {
  static constexpr MsgType kType = MsgType::kProgress;
  uint64_t epoch = 0;
  uint64_t steps_done = 0;
  uint32_t work_pending = 0;
  template <class A>
  void serialize(A& ar) {
    ar(epoch, steps_done, work_pending);
  }
};

}  // namespace baton::proto
