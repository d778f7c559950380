// RouterMetrics: the router's Prometheus metrics, rendered at GET /metrics.
//
//   baton_router_requests_total{route,status}            counter
//   baton_router_upstream_errors_total{kind}             counter
//   baton_router_time_to_first_token_seconds{route}      histogram (streams: first token event)
//   baton_router_request_duration_seconds{route}         histogram (arrival to last byte)
//   baton_router_queue_wait_seconds                      histogram (time waiting for an engine)
//   baton_router_replays_total{kind}                     counter: "replay" (tokens already
//                                                        sent, continued on ids), "retry"
//                                                        (nothing sent, sent again whole)
//   baton_router_replay_failures_total                   counter: streams ended with an error
//   baton_router_engine_stalls_total                     counter: engines found stalled
//   baton_router_failover_next_token_seconds             histogram: an attempt that had sent
//                                                        tokens failed, to the first new token
//                                                        of its continuation (1 ms .. 60 s)
//   plus, set at render time: queue length, requests in flight, failovers seen, each
//   engine's current weight, the primary, the route table version and epoch, and each
//   engine's outcomes (EngineOutcomes): baton_router_engine_requests_total{engine_id} and
//   baton_router_engine_errors_total{engine_id} (attempts ended, attempts failed),
//   baton_router_engine_compared_total{engine_id} and
//   baton_router_engine_disagreed_total{engine_id} (a canary's answers compared with the
//   primary's, and those that differed), and baton_router_shadows_total{outcome} (shadow
//   requests: compared, failed, busy).
//
// Thread-safe (one mutex; observations are a few additions).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "base/mutex.h"
#include "proto/messages.h"
#include "router/admission.h"
#include "router/canary/shadow_comparer.h"
#include "router/fleet/fleet_admission.h"
#include "router/fleet/fleet_view.h"

namespace baton {

// A fixed-bucket histogram in seconds.
class Histogram {
 public:
  // Request latencies: 0.5 ms .. 10 s.
  static constexpr std::array<double, 14> kBounds = {
      0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
  // Failover gaps (detection, promotion, the next engine's prefill): 1 ms .. 60 s.
  static constexpr std::array<double, 15> kFailoverBounds = {
      0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};

  // `bounds` (ascending) must outlive the histogram: one of the arrays above.
  explicit Histogram(std::span<const double> bounds = kBounds)
      : bounds_(bounds), buckets_(bounds.size()) {}
  void Observe(double seconds);
  // The sample lines of `name` with extra `labels` ("" or `route="x"`).
  void Render(const std::string& name, const std::string& labels, std::string* out) const;

 private:
  std::span<const double> bounds_;
  std::vector<uint64_t> buckets_;
  uint64_t count_ = 0;
  double sum_ = 0;
};

struct RouterGauges {
  proto::RouteTable table = {};
  bool controller_connected = false;
  size_t queued = 0;
  size_t in_flight = 0;
  uint64_t failovers = 0;
  std::vector<TargetWeight> weights = {};
  std::vector<proto::EngineOutcome> outcomes = {};
  ShadowStats shadows = {};
  // A fleet router's view (docs/fleet.md): set only with etcd.
  bool fleet = false;
  std::vector<FleetNodeView> fleet_nodes = {};
  FleetViewState fleet_view = {};
  std::vector<std::pair<std::string, proto::EngineOutcome>> fleet_outcomes = {};  // by node
};

class RouterMetrics {
 public:
  // The completion routes' 200 and 429 series, and the upstream errors of kind engine_key,
  // exist from the start at 0: rate() over a series counts no increment before its first
  // sample, so the first shedding (or engine key refusal) would go unseen.
  RouterMetrics();
  void Record(const std::string& route, int status);
  void RecordUpstreamError(const std::string& kind);
  void ObserveFirstToken(const std::string& route, double seconds);
  void ObserveDuration(const std::string& route, double seconds);
  void ObserveQueueWait(double seconds);
  void RecordReplay(bool tokens_sent);
  void RecordReplayFailure();
  // An engine found stalled (EngineProgress), once per stall.
  void RecordEngineStall();
  void ObserveFailoverNextToken(double seconds);

  std::string Render(const RouterGauges& gauges) const;
  // The baton_router_fleet_* lines (a part of Render()).
  static void RenderFleet(const RouterGauges& gauges, std::string* out);

 private:
  mutable Mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_ BATON_GUARDED_BY(mu_);
  std::map<std::string, uint64_t> upstream_errors_ BATON_GUARDED_BY(mu_);
  std::map<std::string, Histogram> first_token_ BATON_GUARDED_BY(mu_);
  std::map<std::string, Histogram> duration_ BATON_GUARDED_BY(mu_);
  Histogram queue_wait_ BATON_GUARDED_BY(mu_);
  Histogram failover_next_token_ BATON_GUARDED_BY(mu_){Histogram::kFailoverBounds};
  uint64_t replays_ BATON_GUARDED_BY(mu_) = 0;
  uint64_t retries_ BATON_GUARDED_BY(mu_) = 0;
  uint64_t replay_failures_ BATON_GUARDED_BY(mu_) = 0;
  uint64_t engine_stalls_ BATON_GUARDED_BY(mu_) = 0;
};

}  // namespace baton
