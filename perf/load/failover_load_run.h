// The two runs of baton-perf-failover-load against a live stack: the reference run (every
// request once with no fault, each output kept) and the load run (requests started on their
// schedule by a pool of clients while the faults are injected).
//
// Each fault has a probe: a long streaming request (failover_load_ledger.h, MakeProbeRequest)
// that the fault thread sends itself at the fault's time; once its first events have reached
// the client, the primary is signalled with kill(2) (SIGKILL for "kill", SIGSTOP for "hang"),
// its pid read from `batonctl status` just before. So every fault lands in the middle of a
// stream that has already sent tokens, which the load's own requests (a few ms each on the
// tiny model) rarely are. Probes are ordinary ledger entries, compared like the others.
//
// Thread: called from the driver's main thread; they start and join their own threads.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "perf/load/failover_load_ledger.h"
#include "perf/load/load_procs.h"

namespace baton::perf {

// Whether the probe of the fault numbered `k` is a chat completion: every other one (the
// hang's by default), so that a chat stream is cut mid-way and continued too.
inline bool ProbeIsChat(int k) { return k % 2 == 1; }

// `count` seeds for probes, the ones whose probe streams run longest (of 32 tried through
// `router` for each kind, ProbeIsChat): the longer the stream, the surer the fault lands
// while its engine generates.
Result<std::vector<uint64_t>> ProbeSeeds(const std::string& router, const std::string& model,
                                         int count);

// Sends every request of `requests` through `router` with no fault (16 clients); an error if
// one is not ok. `repeat_mismatches` counts the first 20 that differ when sent again.
Result<std::vector<Reference>> ReferenceRun(const std::string& router,
                                            const std::vector<LoadRequest>& requests,
                                            int* repeat_mismatches);

// Runs requests [0, load_count) on their schedule from `clients` clients, and each fault (in
// at_s order) with its probe, requests[fault.probe]. Fills `entries` (one per request) and
// the faults' at_s (when the signal was sent; -1 when it was not), pid, engine and error.
void RunLoad(const std::string& router, const std::vector<LoadRequest>& requests, int load_count,
             int clients, const ControllerPair& pair, std::vector<Fault>* faults,
             std::vector<LedgerEntry>* entries);

}  // namespace baton::perf
