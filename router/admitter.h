// Admitter: what a relayed request asks of the router's admission, whether the router follows
// one controller (Admission) or a fleet of nodes found in etcd (FleetAdmission).
//
// A request asks for a target (Request), gives its place back when an attempt ends
// (Release), and may leave the queue (Cancel). WatchLoss() lets an attempt in flight hear
// that its target left the route (a fleet node whose lease expired), so it is replayed
// elsewhere at once instead of waiting on an engine that may never answer.
//
// Thread-safe; callbacks run outside any lock of the implementation.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "proto/roles.h"

namespace baton {

struct Target {
  std::string address = {};  // HOST:PORT
  uint64_t engine_id = 0;
  std::string node = {};  // the fleet node serving it; "" for the router's own controller
  // Set by Request(): the engine was a canary when it was picked. An answer it gives after a
  // rollback took it out of the table is still a canary's (its 5xx is retried elsewhere).
  bool canary = false;
  // The same engine (`canary` is what was known when picked, not part of its identity).
  bool operator==(const Target& o) const {
    return address == o.address && engine_id == o.engine_id && node == o.node;
  }
};

struct TargetWeight {
  Target target;
  double weight = 0;  // percent of new requests, the ramp included
  proto::EngineRole role = proto::EngineRole::kPrimary;  // kPrimary or kCanary
};

// What a request asks for.
struct AdmitRequest {
  bool replay = false;                // an admitted request that lost its engine
  std::optional<Target> failed = {};  // the target a replay failed on
  std::string model = {};             // the requested model; "" for any (a fleet routes by it)
};

class Admitter {
 public:
  using Grant = std::function<void(Result<Target>)>;
  virtual ~Admitter() = default;

  // `grant` is called once, now or later: a target, ResourceExhausted (the queue is full),
  // DeadlineExceeded (no target within the queue's wait), Unavailable (cancelled), NotFound
  // (no node serves the model) or FailedPrecondition (out of service: the operator drained
  // the pair, or every node serving the model, and no target comes until `batonctl resume`;
  // refused at once, not queued). Only the out-of-service refusal is FailedPrecondition, so
  // the router answers it 503 without looking at the message. Returns a ticket.
  virtual uint64_t Request(AdmitRequest request, Grant grant) = 0;
  virtual void Cancel(uint64_t ticket) = 0;
  virtual void Release(const Target& target) = 0;
  // `target` refused a connection: it is not listening (a dead primary still in the route
  // table while the controller fences it, or hangs). Requests wait in the queue instead of
  // being sent there again, until the route changes or a probe may try it again.
  virtual void Unreachable(const Target& target) = 0;
  virtual bool IsCanary(const Target& target) const = 0;
  // The primary whose answers a canary's are compared with: the ready primary serving next
  // to `canary` (the same node).
  virtual std::optional<Target> PrimaryFor(const Target& canary) const = 0;
  // Calls `lost` (once, on any thread) if `target` leaves the route while watched. Returns a
  // watch id for Unwatch(); 0 when targets are never lost this way.
  virtual uint64_t WatchLoss(const Target& target, std::function<void()> lost) = 0;
  virtual void Unwatch(uint64_t watch) = 0;
  virtual int RetryAfterSeconds() const = 0;
};

}  // namespace baton
