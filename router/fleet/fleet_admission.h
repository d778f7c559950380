// FleetAdmission: which node of a fleet, and which engine there, a request goes to
// (docs/fleet.md, Routers).
//
// Each node listed in etcd keeps an Admission of its own, fed with that node's route table,
// so a node's ramp after a failover and its canary weights apply as they do on one machine.
// A request goes to a node that serves its model (`model` "" matches any) and lists a ready
// primary: the one with the fewest requests in flight through this router; among those, a
// node whose record reports its KV pool fuller than the emptiest one's by more than
// kLoadBand (a fraction of its blocks granted) is passed over; the rest take turns. The band
// keeps every router from sending all of its requests to the one emptiest node between two
// load reports (one a second).
// A replay leaves the node that failed it when another serves the model, and a node a replay
// failed on is passed over by new requests for `suspect_for` (a node whose processes all
// died refuses connections until its lease runs out). A request for a model no node ever
// served is refused at once (NotFound); one that finds no node with a primary waits in the
// fleet's queue (bounded as Admission's, by `max_queue` and `max_queue_wait`).
//
// A node whose table is out of service (IsOutOfService(): its operator drained it) takes no
// request, and its waiters (Admission's FailedPrecondition) go to another node. When every
// listed node serving the model is out of service, a request (new or replay) is refused at
// once with FailedPrecondition, and so are the fleet queue's waiters for that model: no
// primary comes until `batonctl resume`. A node without a primary for another reason (a
// failover) keeps the request waiting, as above.
//
// A node that leaves (SetNodes() no longer lists it: its lease expired) takes no request:
// its waiters go to another node, and the attempts in flight there that are watched
// (WatchLoss) are told at once, so they replay elsewhere instead of waiting on an engine that
// may be frozen. A node that comes back is routed to once it is listed again. One that stays
// away is forgotten by Forget() once nothing of it is left (its failovers stay counted), so
// that a router does not keep every node it ever saw. A new
// controller on a node (pid or start time changed) is a new set of engines
// (Admission::ControllerRestarted()).
//
// Time comes from the injected Clock. Thread-safe; grants and loss callbacks run outside
// the lock, on the calling thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/mutex.h"
#include "fleet/fleet_records.h"
#include "proto/messages.h"
#include "router/admission.h"
#include "router/admitter.h"

namespace baton {

// One node as the router sees it, for /health and /metrics.
struct FleetNodeView {
  std::string name;
  std::string model;
  bool listed = false;          // in etcd now
  bool suspect = false;         // a replay failed there recently
  bool out_of_service = false;  // its table says drained (IsOutOfService())
  std::optional<Target> primary;
  size_t in_flight = 0;
  size_t queued = 0;
  double load = 0;  // the pool use its record reports: above the lightest + kLoadBand, passed over
};

class FleetAdmission : public Admitter {
 public:
  static constexpr double kLoadBand = 0.1;

  FleetAdmission(const Clock& clock, AdmissionOptions options,
                 std::chrono::milliseconds suspect_for = std::chrono::milliseconds(1000));

  // Every node of the fleet now. Nodes missing from `nodes` leave (see above). Until the first
  // call (no view of the fleet yet: a router started while etcd does not answer) a request
  // for any model waits in the queue: no model is refused as unknown before the fleet is seen.
  void SetNodes(const std::vector<FleetNode>& nodes);

  uint64_t Request(AdmitRequest request, Grant grant) override;
  void Cancel(uint64_t ticket) override;
  void Release(const Target& target) override;
  void Unreachable(const Target& target) override;
  bool IsCanary(const Target& target) const override;
  std::optional<Target> PrimaryFor(const Target& canary) const override;
  uint64_t WatchLoss(const Target& target, std::function<void()> lost) override;
  void Unwatch(uint64_t watch) override;
  int RetryAfterSeconds() const override;
  // Expires waiters and advances every node's ramp.
  void Tick();
  // Forgets the nodes unlisted for `retention` or more at `now` with nothing in flight,
  // queued or watched there: they leave Nodes() (/health, /metrics), and a request for a
  // model only they served is refused as for any unknown model. Returns how many.
  size_t Forget(TimePoint now, Duration retention);

  // Whether at least one listed node serves `model` ("" any) and every such node is out of
  // service (IsOutOfService() of its table).
  bool OutOfService(const std::string& model) const;
  std::vector<FleetNodeView> Nodes() const;
  // A listed node's ready primary (for /health), if any has one.
  std::optional<Target> AnyPrimary() const;
  size_t queued() const;
  size_t in_flight() const;
  uint64_t failovers() const;  // over every node
  std::vector<TargetWeight> Weights() const;

 private:
  struct Node {
    std::string model;
    std::shared_ptr<Admission> admission;
    bool listed = false;
    TimePoint left_at;  // when it was last unlisted
    TimePoint suspect_until;
    int64_t controller_pid = 0;
    int64_t controller_started_at = 0;
    proto::RouteTable routes;
    double load = 0;  // the pool use its record reports (FleetNode::Load)
  };
  struct Ticket {
    std::string node;  // "" while in the fleet's queue
    uint64_t inner = 0;
    uint64_t dispatch = 0;  // which dispatch `inner` belongs to
  };
  struct Waiter {
    uint64_t ticket = 0;
    AdmitRequest request;
    Grant grant;
    TimePoint deadline;
  };
  struct Watch {
    std::string node;
    std::function<void()> lost;
  };

  // Sends the request to a node, or queues or refuses it.
  void Dispatch(uint64_t ticket, AdmitRequest request, Grant grant, TimePoint deadline);
  // The inner grant: a waiter of a node that left is dispatched again.
  Grant Wrap(uint64_t ticket, AdmitRequest request, Grant grant, TimePoint deadline);
  std::optional<std::string> PickNode(const AdmitRequest& request, TimePoint now)
      BATON_REQUIRES(mu_);
  bool KnownModel(const std::string& model) const BATON_REQUIRES(mu_);
  bool OutOfServiceLocked(const std::string& model) const BATON_REQUIRES(mu_);
  Status OutOfServiceError(const std::string& model) const;
  std::shared_ptr<Admission> AdmissionOf(const std::string& node) const;
  // Dispatches the fleet queue's waiters that can go, refuses the expired.
  void DrainQueue();
  // Whether a ticket or a watch still names `node`.
  bool Referenced(const std::string& node) const BATON_REQUIRES(mu_);

  const Clock& clock_;
  const AdmissionOptions options_;
  const std::chrono::milliseconds suspect_for_;
  mutable Mutex mu_;
  std::map<std::string, Node> nodes_
      BATON_GUARDED_BY(mu_);  // every node seen; those that left stay, unlisted, until Forget()
  std::map<uint64_t, Ticket> tickets_ BATON_GUARDED_BY(mu_);
  std::deque<Waiter> queue_ BATON_GUARDED_BY(mu_);
  std::map<uint64_t, Watch> watches_ BATON_GUARDED_BY(mu_);
  uint64_t next_ticket_ BATON_GUARDED_BY(mu_) = 1;
  uint64_t next_watch_ BATON_GUARDED_BY(mu_) = 1;
  uint64_t next_dispatch_ BATON_GUARDED_BY(mu_) = 1;
  size_t turn_ BATON_GUARDED_BY(mu_) = 0;  // breaks ties between equally loaded nodes
  uint64_t forgotten_failovers_ BATON_GUARDED_BY(mu_) = 0;  // of the nodes Forget() dropped
  bool viewed_ BATON_GUARDED_BY(mu_) = false;               // SetNodes() was called
};

}  // namespace baton
