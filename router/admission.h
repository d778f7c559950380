// Admission: which engine a request goes to, and when.
//
// Targets come from the route table: ready entries whose role is primary or canary, each
// with its weight, picked by smooth weighted round-robin. A primary with weight 0 counts as
// 100 unless a ready canary with a weight is listed: then (a canary at 100 %) it takes no new
// requests, but a replay that finds no weighted target may still go to it. A canary with
// weight 0 takes nothing. A request that finds no target waits in a bounded FIFO queue; past
// `max_queue_wait` it is refused with DeadlineExceeded, and when the queue already holds
// `max_queue` requests with ResourceExhausted (the router answers 429 with Retry-After to
// both). A waiter whose client went
// away leaves the queue at once (Cancel).
//
// Ramp: when the primary changes (a promotion), the new primary takes traffic in steps
// (`ramp_steps`, default 30 %, 60 %, 100 %, spread over `ramp_duration`): its requests in
// flight are capped at the step's share of the peak concurrency seen before the promotion
// (at least 1); the rest wait in the queue, which drains as requests end and steps rise.
// A new primary that was a ready canary with a weight in the previous table already carries
// traffic: it takes over at once, without a ramp (still counted in failovers()).
//
// Replays (requests already admitted that lost their engine) skip the ramp and the cap and
// go ahead of the queue. A replay may name the target that just failed: it is not chosen
// again until the route table changes or `retry_same_after` has passed, so a dead primary
// still listed is not hammered while the controller fences it. A target that refused a
// connection (Unreachable) is chosen for no request at all until the route table changes or
// `retry_same_after` has passed (then one request probes it): while a dead primary stays
// listed (a controller that hangs), requests wait in the bounded queue and get 429 past
// `max_queue_wait`, instead of being sent to a closed port.
//
// Out of service: a table whose pair state is `draining` or `stopped` (`batonctl drain`) says
// that no primary comes until `batonctl resume`. A request that finds no target then is
// refused at once with FailedPrecondition instead of waiting (a new request, a replay, and
// the waiters queued when that table arrives alike; the router answers 503). Other pair states
// without a primary (`down`, `failing_over`, `recovering`, `stopping`, ...) queue as above: a
// primary may come.
//
// Time comes from the injected Clock; Tick() expires waiters and advances the ramp (the
// router calls it every few milliseconds). Callbacks run outside the lock, on the calling
// thread of Request()/SetTable()/Release()/Tick(). Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/mutex.h"
#include "base/status.h"
#include "proto/messages.h"
#include "router/admitter.h"

namespace baton {

struct AdmissionOptions {
  size_t max_queue = 1024;
  std::chrono::milliseconds max_queue_wait{5000};
  std::vector<double> ramp_steps{0.3, 0.6, 1.0};
  std::chrono::milliseconds ramp_duration{2000};
  std::chrono::milliseconds retry_same_after{250};
};

// Whether `table` says the pair was taken out of service by its operator: pair state
// `draining` or `stopped` (`batonctl drain`, until `batonctl resume`).
bool IsOutOfService(const proto::RouteTable& table);

class Admission : public Admitter {
 public:
  // `node` is stamped on every target (Target::node): a fleet node's name, or "".
  Admission(const Clock& clock, AdmissionOptions options, std::string node = "");

  // A new route table. A changed primary starts a ramp. Waiters that can go now are granted;
  // the rest are refused with FailedPrecondition when the table is out of service.
  void SetTable(const proto::RouteTable& table);
  // Asks for a target; `grant` is called once, now or later. A replay passes the target
  // that failed it (if any) in `failed`. A new request that can go now always goes; one that
  // would wait is refused when `max_queue` requests already wait. Returns a ticket for
  // Cancel().
  uint64_t Request(bool replay, std::optional<Target> failed, Grant grant);
  // The same; `request.model` is not looked at (one controller serves one model).
  uint64_t Request(AdmitRequest request, Grant grant) override {
    return Request(request.replay, std::move(request.failed), std::move(grant));
  }
  // The client of a waiting request went away: it leaves the queue at once (its place is
  // not held until its deadline) and its grant is called with Unavailable. Nothing happens
  // when the request is no longer waiting.
  void Cancel(uint64_t ticket) override;
  // A granted request ended (or its attempt did): frees its place on `target`.
  void Release(const Target& target) override;
  void Unreachable(const Target& target) override;
  void Tick();
  // The route is gone (a fleet node left): every waiter's grant is called with Unavailable, and
  // no target is listed (nor is the route out of service) until the next SetTable().
  void Evict();
  // The controller was restarted (its engines died with the old one): the next primary is a
  // new engine even if its address and id are the old primary's, so it ramps up and counts
  // as a failover.
  void ControllerRestarted();

  // True when `target` is a canary: listed as one since it entered the table, and not the
  // primary since (a rolled-back canary still draining stays one).
  bool IsCanary(const Target& target) const override;
  // The ready primary of the last table (listed even at weight 0), if it has one.
  std::optional<Target> Primary() const;
  std::optional<Target> PrimaryFor(const Target&) const override { return Primary(); }
  // Whether the last table is out of service (IsOutOfService() of it).
  bool OutOfService() const;
  // One controller's engines leave the route through its tables: nothing to watch.
  uint64_t WatchLoss(const Target&, std::function<void()>) override { return 0; }
  void Unwatch(uint64_t) override {}
  size_t queued() const;
  size_t in_flight() const;
  uint64_t failovers() const;
  // The current share of each target (the ramp applied), for /metrics.
  std::vector<TargetWeight> Weights() const;
  // Seconds a refused client should wait before retrying.
  int RetryAfterSeconds() const override;

 private:
  struct Waiter {
    uint64_t ticket = 0;
    bool replay = false;
    std::optional<Target> failed;
    uint64_t failed_generation = 0;
    TimePoint failed_at;
    TimePoint deadline;
    Grant grant;
  };
  struct Candidate {
    Target target;
    int weight = 0;
    int current = 0;  // smooth weighted round-robin state
  };
  using Ready = std::vector<std::pair<Grant, Result<Target>>>;

  // SetTable's steps: the table's ready canaries with a weight; candidates_ from the table
  // (`no_canary`: a weightless primary takes everything), returning its ready primary; a new
  // primary counted as a failover and ramped onto (not after a re-adoption, nor for a canary
  // that already carried traffic); canary_ids_ kept for IsCanary.
  std::vector<Target> WeightedCanaries(const proto::RouteTable& table) const BATON_REQUIRES(mu_);
  std::optional<Target> ListCandidates(const proto::RouteTable& table, bool no_canary)
      BATON_REQUIRES(mu_);
  void NotePrimary(const std::optional<Target>& primary, uint64_t epoch) BATON_REQUIRES(mu_);
  void TrackCanaryIds(const proto::RouteTable& table) BATON_REQUIRES(mu_);
  void Drain(TimePoint now, Ready* ready) BATON_REQUIRES(mu_);
  std::optional<Target> Pick(const Waiter& w, TimePoint now) BATON_REQUIRES(mu_);
  // The refusal of a waiter that finds no target while out of service.
  Status OutOfServiceError() const BATON_REQUIRES(mu_);
  // Whether `t`'s address refused a connection less than retry_same_after ago.
  bool Refused(const Target& t, TimePoint now) const BATON_REQUIRES(mu_);
  bool UnderRampCap(const Target& t, TimePoint now) const BATON_REQUIRES(mu_);
  Target Marked(Target t) const BATON_REQUIRES(mu_);  // with `canary` set from canary_ids_
  double RampShare(TimePoint now) const BATON_REQUIRES(mu_);
  void Take(const Target& t) BATON_REQUIRES(mu_);
  static void Run(Ready* ready);

  const Clock& clock_;
  AdmissionOptions options_;
  const std::string node_;
  mutable Mutex mu_;
  std::vector<Candidate> candidates_
      BATON_GUARDED_BY(mu_);  // weight 0 only for a primary a canary displaced
  std::vector<Target> canaries_
      BATON_GUARDED_BY(mu_);  // ready canaries with a weight in the last table
  std::set<uint64_t> canary_ids_ BATON_GUARDED_BY(mu_);  // engines that are canaries (IsCanary)
  uint64_t generation_ BATON_GUARDED_BY(mu_) = 0;
  std::optional<Target> primary_
      BATON_GUARDED_BY(mu_);  // the last primary seen (kept while none is listed)
  uint64_t primary_epoch_ BATON_GUARDED_BY(mu_) = 0;  // the table epoch it was last listed at
  bool primary_stale_ BATON_GUARDED_BY(mu_) = false;  // primary_ belonged to a previous controller
  std::optional<Target> listed_primary_
      BATON_GUARDED_BY(mu_);                           // the ready primary of the last table
  std::string pair_state_ BATON_GUARDED_BY(mu_);       // of the last table
  bool out_of_service_ BATON_GUARDED_BY(mu_) = false;  // the last table's, see above
  std::deque<Waiter> queue_ BATON_GUARDED_BY(mu_);
  // Addresses that refused a connection since the last table, and when.
  std::map<std::string, TimePoint> refused_ BATON_GUARDED_BY(mu_);
  uint64_t next_ticket_ BATON_GUARDED_BY(mu_) = 1;
  std::map<std::string, size_t> in_flight_ BATON_GUARDED_BY(mu_);  // by address
  size_t total_in_flight_ BATON_GUARDED_BY(mu_) = 0;
  size_t peak_in_flight_ BATON_GUARDED_BY(mu_) = 0;  // since the last promotion
  uint64_t failovers_ BATON_GUARDED_BY(mu_) = 0;
  // The ramp onto a new primary.
  std::optional<Target> ramp_target_ BATON_GUARDED_BY(mu_);
  TimePoint ramp_start_ BATON_GUARDED_BY(mu_);
  size_t ramp_base_ BATON_GUARDED_BY(mu_) = 1;
};

}  // namespace baton
