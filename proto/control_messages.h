// The control-plane messages of proto/messages.h: route tables for routers and batonctl's
// commands. Part of proto/messages.h, which includes it where these types are needed;
// include that header, not this one.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "proto/roles.h"

namespace baton::proto {

// Router -> controller: send me the route table now and on every change.
struct Subscribe {
  static constexpr MsgType kType = MsgType::kSubscribe;
  std::string subscriber = {};
  template <class A>
  void serialize(A& ar) {
    ar(subscriber);
  }
};

// On the wire the role is its name (proto/roles.h); a name that is no role fails the decode.
struct RouteEntry {
  uint64_t engine_id = 0;
  EngineRole role = EngineRole::kStandby;  // primary, standby, draining, promoting or canary
  std::string http_address = {};
  bool ready = false;   // accepts traffic now
  uint32_t weight = 0;  // share of traffic in percent
  std::string engine_version = {};
  template <class A>
  void save(A& ar) const {
    ar(engine_id, std::string(ToString(role)), http_address, ready, weight, engine_version);
  }
  template <class A>
  void load(A& ar) {
    std::string name;
    ar(engine_id, name, http_address, ready, weight, engine_version);
    Result<EngineRole> parsed = ParseEngineRole(name);
    if (!parsed.ok()) throw std::invalid_argument(parsed.status().message());
    role = *parsed;
  }
  bool operator==(const RouteEntry&) const = default;
};

// Controller -> subscriber: which engine serves. `version` increases with every table.
struct RouteTable {
  static constexpr MsgType kType = MsgType::kRouteTable;
  uint64_t version = 0;
  uint64_t epoch = 0;
  std::string pair_state = {};
  std::vector<RouteEntry> entries = {};
  template <class A>
  void serialize(A& ar) {
    ar(version, epoch, pair_state, entries);
  }
};

// What one router saw of one engine since the router started: cumulative counters.
struct EngineOutcome {
  uint64_t engine_id = 0;
  uint64_t requests = 0;     // attempts on this engine that ended (well or not)
  uint64_t errors = 0;       // attempts that failed: HTTP 5xx, connection lost, bad stream
  uint64_t duration_ms = 0;  // sum over the attempts that succeeded, arrival to last byte
  uint64_t succeeded = 0;    // attempts counted in duration_ms
  // Shadow comparison (a canary's engine id only): seeded or greedy answers of this canary
  // compared with the primary's answer to the same request, and those whose token ids differed.
  uint64_t compared = 0;
  uint64_t disagreed = 0;
  template <class A>
  void serialize(A& ar) {
    ar(engine_id, requests, errors, duration_ms, succeeded, compared, disagreed);
  }
  bool operator==(const EngineOutcome&) const = default;
};

// Router -> controller, on its subscription (protocol 4 and up), a few times a second: what
// the router saw of each engine. The controller judges a canary on these numbers.
// `router` names the router process (random, fixed for its life): a router that reconnects
// replaces its own earlier report instead of adding to it.
struct RouterReport {
  static constexpr MsgType kType = MsgType::kRouterReport;
  uint64_t seq = 0;
  std::vector<EngineOutcome> engines = {};
  std::string router = {};
  template <class A>
  void serialize(A& ar) {
    ar(seq, engines, router);
  }
};

// Router -> controller, on its subscription (protocol 10 and up): engine `engine_id` has
// sent no byte on any of its `streams` streams that had begun answering for `quiet_ms` (its
// compute hangs, though its heartbeats may go on). Sent every report interval while it
// lasts; `router` as in RouterReport. The controller ignores one with no stream or quieter
// than kMinStallQuietMs (the least stall timeout a router takes): no evidence of a hang.
inline constexpr uint64_t kMinStallQuietMs = 1000;
struct EngineStalled {
  static constexpr MsgType kType = MsgType::kEngineStalled;
  uint64_t engine_id = 0;
  uint32_t streams = 0;
  uint64_t quiet_ms = 0;
  std::string router = {};
  template <class A>
  void serialize(A& ar) {
    ar(engine_id, streams, quiet_ms, router);
  }
};

// batonctl -> controller: one command (`status`, `promote`, `drain`, `drill`, `timeline`).
struct CtlRequest {
  static constexpr MsgType kType = MsgType::kCtlRequest;
  std::string command = {};
  std::vector<std::string> args = {};
  template <class A>
  void serialize(A& ar) {
    ar(command, args);
  }
};

// Controller -> batonctl: exit_code 0 done, 1 refused (text says why), 2 bad usage.
struct CtlReply {
  static constexpr MsgType kType = MsgType::kCtlReply;
  uint32_t exit_code = 0;
  std::string text = {};
  std::string json = {};  // one JSON object
  template <class A>
  void serialize(A& ar) {
    ar(exit_code, text, json);
  }
};

}  // namespace baton::proto
