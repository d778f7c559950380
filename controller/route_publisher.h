// RoutePublisher: tells subscribers (the router) which engine serves.
//
// A subscriber is a connection that said Hello with role "router" and sent Subscribe. It gets
// the current RouteTable at once (once one was published: a restarted controller publishes
// none until it has re-adopted its primary, and the router keeps its last table meanwhile)
// and a new one on every change; Publish() sends only when the
// entries, the epoch or the pair state differ from the last table, and each table sent has a
// higher version. A subscriber whose send fails is dropped (its connection is closed).
//
// A subscriber may send Subscribe again (it gets the current table) or, from protocol 4, a
// RouterReport: what that router saw of each engine, cumulative since the router started.
// The latest report of each router (by the report's `router` name; a report without one is
// keyed by its connection) is kept, also after its connection closes, so a sum never goes
// down while routers come and go, and a router that reconnects replaces its own report
// rather than adding to it. Outcomes() sums them by engine. The reports of the
// kMaxRouters routers heard from most recently are kept. Anything else, or a report that
// does not decode, drops the subscriber with the reason logged and sent in an ErrorMsg.
// From protocol 10 a subscriber may also send EngineStalled: handed to OnStalled's callback.
//
// Ownership: the publisher owns the subscriber channels. Thread: io_context thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/clock.h"
#include "proto/messages.h"
#include "proto/transport/channel.h"

namespace baton {

class RoutePublisher {
 public:
  // Takes the subscriber's channel, sends it the current table and watches it for EOF.
  void AddSubscriber(std::unique_ptr<proto::Channel> channel, const std::string& name);

  // Publishes `table` (its version is assigned here) if it differs from the last one.
  // Returns true if a new table was made.
  bool Publish(proto::RouteTable table);

  // A fleet router's report, read from etcd (controller/fleet_reports.h): kept as a
  // subscriber's, by its router name.
  void StoreFleetReport(proto::RouterReport report);
  // Called with each EngineStalled a router sends (io_context thread).
  void OnStalled(std::function<void(const proto::EngineStalled&)> fn) {
    on_stalled_ = std::move(fn);
  }
  // The clock LastSuccess() reads; set before the first report.
  void SetClock(const Clock* clock) { clock_ = clock; }
  // When a report last showed `engine` answer a request well (its `succeeded` rose since the
  // same router's report before), by any router; none when never seen. A router that finds
  // the engine's streams stalled may see only those that wait (preempted, say) while it
  // answers others': such a report is no stall.
  std::optional<TimePoint> LastSuccess(uint64_t engine) const;

  // Per engine id, the sum over the latest RouterReport of each router kept.
  std::map<uint64_t, proto::EngineOutcome> Outcomes() const;

  const proto::RouteTable& current() const { return current_; }
  size_t subscriber_count() const { return subscribers_.size(); }
  // The routers Outcomes() hears from: those subscribed now, and the fleet routers whose
  // reports came through etcd (StoreFleetReport), which never subscribe.
  size_t router_count() const { return subscribers_.size() + fleet_reports_; }

 private:
  void Watch(uint64_t id);
  struct Subscriber {
    std::unique_ptr<proto::Channel> channel;
    std::string name;
  };
  struct Report {
    std::vector<proto::EngineOutcome> engines;
    uint64_t heard = 0;  // order of arrival, for pruning
    bool fleet = false;  // read from etcd (StoreFleetReport)
  };
  static constexpr size_t kMaxRouters = 64;
  using SubscriberMap = std::map<uint64_t, Subscriber>;

  void SendTo(uint64_t id);
  // Forgets the subscriber (closing its channel); its last report stays.
  void Drop(SubscriberMap::iterator it);
  void Store(uint64_t id, proto::RouterReport report, bool fleet = false);
  // Forgets LastSuccess() of the engines no kept report names (routers forget engines long
  // gone from their tables), so that it does not grow with every engine id.
  void ForgetUnreported();
  // Drops the subscriber after telling it why (a FailedPrecondition ErrorMsg).
  void Refuse(SubscriberMap::iterator it, const std::string& why);

  proto::RouteTable current_;
  bool published_ = false;
  uint64_t next_id_ = 1;
  SubscriberMap subscribers_;
  std::map<std::string, Report> reports_;  // by router name
  uint64_t heard_ = 0;
  std::function<void(const proto::EngineStalled&)> on_stalled_;
  const Clock* clock_ = nullptr;
  std::map<uint64_t, TimePoint> last_success_;  // by engine id
  size_t fleet_reports_ = 0;                    // reports_ with `fleet`
};

}  // namespace baton
