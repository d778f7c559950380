// StallTracker: which of the stalls EngineProgress finds a router reports (docs/router.md,
// Stalled engines): only those found at this evaluation and at the one before (an engine
// whose stream moves between two evaluations a report interval apart is no stall), by node
// and engine id (a fleet router's engine ids are each node's own).
//
// Confirm() takes the stalls found now and returns those found the time before too, grouped
// by node (node "" for the router's own controller), each as the EngineStalled to send; a
// stall confirmed for the first time since it began is also in `first`, for the router to
// log and count once per stall. Reset() forgets every stall (the stall check is off, or the
// router's io threads were frozen, so what it read of its engines is late).
//
// Ownership: a value. Thread: one caller at a time (the thread that sends the reports).
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "proto/messages.h"
#include "router/canary/engine_progress.h"

namespace baton {

class StallTracker {
 public:
  struct Confirmed {
    std::map<std::string, std::vector<proto::EngineStalled>> by_node;  // node -> its stalls
    std::vector<EngineProgress::Stall> first;  // confirmed now for the first time
  };

  Confirmed Confirm(const std::vector<EngineProgress::Stall>& found);
  void Reset();

 private:
  using Key = std::pair<std::string, uint64_t>;  // (node, engine id)
  std::set<Key> seen_;                           // found at the last evaluation
  std::set<Key> reported_;                       // confirmed at the last evaluation
};

}  // namespace baton
