// FleetLoad: the steady load of baton-perf-fleet. `clients` threads, each with one keep-alive
// connection to one router (client c to routers[c % R]), send the request list round-robin
// back to back (a closed loop) until Stop(). Every call becomes a FleetSample: when it was
// sent and ended, when each chunk of its body arrived (a stream is relayed one event per
// chunk), and its ledger entry (perf/load/failover_load_ledger.h: status, outcome, output).
//
// GapAfter() is what a fault costs one request: from `at_s` (or the request's start, if
// later) to the next bytes it received. A request served elsewhere at once waits a token's
// time; one stuck on a dead node waits until the router has sent it to another node.
//
// Ownership: the load owns its threads (joined by Stop or the destructor). Thread: Start,
// Stop and Samples from one thread; Now from any.
#pragma once

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "perf/load/failover_load_ledger.h"

namespace baton::perf {

struct FleetSample {
  int request = 0;  // index into the request list
  int router = 0;
  double sent_s = 0;
  double end_s = 0;
  std::vector<double> chunk_s;  // arrival of each chunk of the body
  LedgerEntry entry;
};

class FleetLoad {
 public:
  FleetLoad(std::vector<std::string> routers, std::vector<LoadRequest> requests, int clients);
  ~FleetLoad() { Stop(); }
  FleetLoad(const FleetLoad&) = delete;
  FleetLoad& operator=(const FleetLoad&) = delete;

  void Start();
  void Stop();
  // Seconds since the load was made.
  double Now() const;
  // Every call so far, in no particular order; call after Stop.
  std::vector<FleetSample> Samples();

 private:
  void Client(int c);

  const std::vector<std::string> routers_;
  const std::vector<LoadRequest> requests_;
  const int clients_;
  const std::chrono::steady_clock::time_point origin_;
  std::atomic<bool> stop_{false};
  std::atomic<int> next_{0};
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::vector<FleetSample> samples_;  // guarded by mu_
};

// Seconds from max(at_s, s.sent_s) to the first chunk received after it (the end of the call
// when none came); -1 when the call had ended by `at_s`.
double GapAfter(const FleetSample& s, double at_s);

}  // namespace baton::perf
