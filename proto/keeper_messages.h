// The messages between the controller and baton-keeper (controller/keeper/memory_keeper.h):
// memory kept while no controller runs. Part of proto/messages.h, which includes it where
// these types are needed; include that header, not this one.
#pragma once

#include <string>

namespace baton::proto {

// Controller -> baton-keeper (controller/keeper/memory_keeper.h): keep these fds under `name`
// with `manifest` (text the controller wrote), replacing what was kept under that name.
struct KeepMemory {
  static constexpr MsgType kType = MsgType::kKeepMemory;
  std::string name = {};
  std::string manifest = {};
  template <class A>
  void serialize(A& ar) {
    ar(name, manifest);
  }
};

// Controller -> baton-keeper: send what is kept under `name`.
struct FetchMemory {
  static constexpr MsgType kType = MsgType::kFetchMemory;
  std::string name = {};
  template <class A>
  void serialize(A& ar) {
    ar(name);
  }
};

// baton-keeper -> controller: the answer to KeepMemory (`found` true, no fds), FetchMemory
// (the fds attached when found) or ReleaseMemory.
struct KeptMemory {
  static constexpr MsgType kType = MsgType::kKeptMemory;
  std::string name = {};
  bool found = false;
  std::string manifest = {};
  template <class A>
  void serialize(A& ar) {
    ar(name, found, manifest);
  }
};

// Controller -> baton-keeper: close what is kept under `name` ("" : everything, and exit).
struct ReleaseMemory {
  static constexpr MsgType kType = MsgType::kReleaseMemory;
  std::string name = {};
  template <class A>
  void serialize(A& ar) {
    ar(name);
  }
};

}  // namespace baton::proto
