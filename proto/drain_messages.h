// The drain messages of proto/messages.h: a primary taken out of service, with a next primary
// behind it (Drain) or none (FinalDrain), its answer (Drained), and a drain called off
// (Resume). Part of proto/messages.h, which includes it where these types are needed;
// include that header, not this one.
#pragma once

#include <cstdint>

namespace baton::proto {

// Controller -> engine: stop admitting requests, finish those in flight within timeout_ms. A
// next primary follows (a switch-over, an upgrade's promotion or rollback): an engine may hand
// its keyed requests over to it instead of finishing them (the router replays them there).
struct Drain {
  static constexpr MsgType kType = MsgType::kDrain;
  uint64_t epoch = 0;
  uint32_t timeout_ms = 0;
  template <class A>
  void serialize(A& ar) {
    ar(epoch, timeout_ms);
  }
};

// Controller -> engine (protocol 9 and up): a drain that no next primary follows (`batonctl
// drain` takes the pair out of service): stop admitting requests and finish every one in
// flight within timeout_ms; hand nothing over. Answered and called off as a Drain is.
struct FinalDrain {
  static constexpr MsgType kType = MsgType::kFinalDrain;
  uint64_t epoch = 0;
  uint32_t timeout_ms = 0;
  template <class A>
  void serialize(A& ar) {
    ar(epoch, timeout_ms);
  }
};

// Engine -> controller: drained; `unfinished` requests were still in flight at the deadline.
struct Drained {
  static constexpr MsgType kType = MsgType::kDrained;
  uint64_t epoch = 0;
  uint32_t unfinished = 0;
  template <class A>
  void serialize(A& ar) {
    ar(epoch, unfinished);
  }
};

// Controller -> engine (protocol 3 and up): the drain is called off, admit requests again.
// Every Drain is still answered by exactly one Drained, sent before the engine resumes; an
// engine still waiting for its requests when Resume arrives may answer at once.
struct Resume {
  static constexpr MsgType kType = MsgType::kResume;
  uint64_t epoch = 0;
  template <class A>
  void serialize(A& ar) {
    ar(epoch);
  }
};

}  // namespace baton::proto
