// The messages of re-adoption (docs/architecture.md): an engine that outlived its controller
// registers with the next one with what it holds. Part of proto/messages.h, which includes it
// where these types are needed; include that header, not this one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace baton::proto {

// What an engine that reattaches was doing when its controller went away.
enum class ReattachRole : uint8_t {
  kStandby = 0,   // a half-started standby (StandbyReady was sent)
  kPromoted = 1,  // promoted at `epoch` and its extents mapped; not serving yet
  kServing = 2,   // serving (PromoteAck was sent)
  kDraining = 3,  // told to drain; Drained not reported yet
  kDrained = 4,   // drained (Drained reported); waiting to be stopped
};

// "standby", "promoted", "serving", "draining", "drained".
const char* ToString(ReattachRole role);

// Engine -> controller, instead of Register, on the connection an engine makes to a
// controller that started after it (protocol 5): who it is and everything it holds, so that
// the controller can check it against its roster and journal. `arena_*` and `pool_*` name
// the memory it maps (st_dev and st_ino of the memfds it was given).
struct Reattach {
  static constexpr MsgType kType = MsgType::kReattach;
  uint64_t engine_id = 0;
  std::string engine_version = {};
  std::string http_address = {};
  uint8_t role = 0;  // ReattachRole
  uint64_t epoch = 0;
  std::vector<BlockRange> extents = {};  // mapped writable now
  uint64_t arena_dev = 0;
  uint64_t arena_ino = 0;
  uint64_t pool_dev = 0;
  uint64_t pool_ino = 0;
  template <class A>
  void serialize(A& ar) {
    ar(engine_id, engine_version, http_address, role, epoch, extents, arena_dev, arena_ino,
       pool_dev, pool_ino);
  }
};

// Controller -> engine: the Reattach is accepted; the engine goes on as it was. A refused
// Reattach gets a Stop instead.
struct ReattachAck {
  static constexpr MsgType kType = MsgType::kReattachAck;
  uint64_t engine_id = 0;
  uint32_t heartbeat_interval_ms = 100;
  template <class A>
  void serialize(A& ar) {
    ar(engine_id, heartbeat_interval_ms);
  }
};

}  // namespace baton::proto
