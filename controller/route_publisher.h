// RoutePublisher: tells subscribers (the router) which engine serves.
//
// A subscriber is a connection that said Hello with role "router" and sent Subscribe. It gets
// the current RouteTable at once and a new one on every change; Publish() sends only when the
// entries, the epoch or the pair state differ from the last table, and each table sent has a
// higher version. A subscriber whose send fails is dropped (its connection is closed).
//
// Ownership: the publisher owns the subscriber channels. Thread: io_context thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "proto/channel.h"
#include "proto/messages.h"

namespace baton {

class RoutePublisher {
 public:
  // Takes the subscriber's channel, sends it the current table and watches it for EOF.
  void AddSubscriber(std::unique_ptr<proto::Channel> channel, const std::string& name);

  // Publishes `table` (its version is assigned here) if it differs from the last one.
  // Returns true if a new table was made.
  bool Publish(proto::RouteTable table);

  const proto::RouteTable& current() const { return current_; }
  size_t subscriber_count() const { return subscribers_.size(); }

 private:
  void Watch(uint64_t id);
  void SendTo(uint64_t id);

  struct Subscriber {
    std::unique_ptr<proto::Channel> channel;
    std::string name;
  };
  proto::RouteTable current_;
  bool published_ = false;
  uint64_t next_id_ = 1;
  std::map<uint64_t, Subscriber> subscribers_;
};

}  // namespace baton
