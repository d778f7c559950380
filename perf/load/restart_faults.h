// The faults of baton-perf-controller-restart: kill -9 of the controller while the load runs,
// each followed at once by a new controller on the same configuration (as systemd's
// Restart=always or `make serve` would start it), and what the new one found.
//
//   plain            the controller alone
//   during_failover  the primary first (SIGKILL), then the controller 2 ms later, while it
//                    fences and promotes
//   during_canary    a canary upgrade is started 3 s before (same engine command, another
//                    version label, steps too long to pass); the controller is killed while
//                    the canary serves its step; 2 s after the restart the canary is rolled
//                    back with batonctl rollback
//
// readopt_ms runs from the new controller's spawn to the first `status` (asked over the
// controller's socket every millisecond) that shows its recovery done with the same engine
// processes as before the kill, the pair ready (during_canary: the canary serving again).
// It is not measured for during_failover (the primary is gone), which reports ready_ms: spawn
// to a ready pair.
//
// Thread: RunRestartLoad is called from the driver's main thread and starts its own.
#pragma once

#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "base/status.h"
#include "perf/load/failover_load_ledger.h"
#include "perf/load/load_procs.h"

namespace baton::perf {

struct RestartFault {
  std::string kind;  // "plain", "during_failover", "during_canary"
  double at_s = 0;   // when the controller is killed, after the load's start
  // -1: not measured (null in the JSON).
  double killed_s = -1;
  double readopt_ms = -1;           // see above
  double ready_ms = -1;             // spawn to a ready pair (or a serving canary)
  double self_readopt_ms = -1;      // what the new controller says (its start to the pair ready)
  uint64_t weights_bytes_read = 0;  // the new controller's own count (status.weights.bytes_read)
  uint64_t io_read_bytes = 0;       // /proc/<pid>/io read_bytes of the new controller when ready
  bool same_engines = false;
  int exited = 0;    // engine processes gone across this fault
  int expected = 0;  // of which the fault itself caused (a killed primary, a retired standby)
  std::string error;
};

// The fast status: one CtlRequest over the controller's socket (no batonctl process).
Result<nlohmann::json> FastStatus(const std::string& socket);

// Runs requests [0, load_count) on their schedule from `clients` clients through `router`
// while the faults run (in at_s order) against `pair`. Fills `entries` and the faults.
void RunRestartLoad(const std::string& router, const std::vector<LoadRequest>& requests,
                    int load_count, int clients, ControllerPair& pair,
                    std::vector<RestartFault>* faults, std::vector<LedgerEntry>* entries);

// kill -9 of the controller alone, no load, a new one spawned: spawn to the same pair ready
// again, in ms.
Result<double> PlainRestart(ControllerPair& pair);

// Today's behaviour, for reference: the controller, its engines and baton-keeper all killed
// (as when engines die with their controller and the memory with it), a new controller
// spawned; spawn to a ready pair, in ms.
Result<double> ColdRestart(ControllerPair& pair, const std::string& runtime_dir);

}  // namespace baton::perf
