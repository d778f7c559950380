// baton-perf-fleet: a fleet under steady load losing whole nodes.
//
//   baton-perf-fleet [--nodes N] [--routers R] [--kills K] [--partitions P]
//                    [--lease-ttl-ms T] [--clients C] [--requests Q] [--settle-s S]
//                    [--bin DIR] [--model-dir DIR] [--out DIR]
//
// Stack (fleet_stack.h): a 3-member etcd cluster on loopback, N Baton nodes (default 3), each
// a controller with a reference-engine pair on baton-mkmodel's tiny preset and a lease of T ms
// (default 2000), and R routers that follow the fleet (default 2). Load (fleet_load.h): C
// clients (default 8) spread over the routers send Q streaming requests (default 48; fixed
// prompts and seeds, temperature 0.8, 16..48 tokens; every other pair a chat completion)
// round-robin back to back, for the whole run; every output is compared with a reference
// run of the same requests with no fault.
//
// Faults, one at a time, the victim turning over the nodes: K kills (default 3: kill -9 of
// the node's controller, keeper and engines; then a new controller on its directory) and P
// partitions (default 3: SIGSTOP of all of them until every router has dropped the node,
// then SIGCONT), alternating, each followed by the node's return to every router's view and
// S s of settling (default 2).
//
// The last line of stdout is one JSON object:
//   invoked, completed (200 with a whole answer), lost (no complete answer), failed (an error
//   status or an error event), mismatched (200 but not the reference's text and token ids;
//   duplicated counts those that repeat a run of tokens), lease_ttl_ms; reroute_ms_p50/p99 over the
//   kills: for each kill, the longest any request waited from the node's death to its next bytes
//   (FleetLoad GapAfter over the calls in flight at the fault or sent before every router had
//   dropped the node), that is node death to its traffic served elsewhere; `partition` the same
//   over the partitions; `faults` each fault's detail (dropped_ms: until every router dropped the
//   node; rejoined_ms: until it was listed with a primary again); steady_gap_ms_max: the same
//   measure at three instants before any fault. meets_targets: lost, failed and mismatched 0 and
//   both reroute_ms_p99 at most lease_ttl_ms + 500. DIR (default: a new directory under /tmp, kept
//   on failure, removed otherwise) keeps every process's log and fleet.json; `out` names it, or
//   is null when it was removed.
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "perf/driver_main.h"
#include "perf/load/failover_load_run.h"
#include "perf/multinode/fleet_load.h"
#include "perf/multinode/fleet_stack.h"
#include "perf/pair/failover_procs.h"

namespace baton {
namespace {

using namespace ::baton::perf;  // NOLINT: the driver's vocabulary
using nlohmann::json;
using std::chrono::milliseconds;

constexpr char kName[] = "baton-perf-fleet";
constexpr char kUsage[] =
    "usage: baton-perf-fleet [--nodes N] [--routers R] [--kills K] [--partitions P]\n"
    "                        [--lease-ttl-ms T] [--clients C] [--requests Q] [--settle-s S]\n"
    "                        [--bin DIR] [--model-dir DIR] [--out DIR]\n";
constexpr double kSlackMs = 500;

struct Flags {
  int nodes = 3, routers = 2, kills = 3, partitions = 3, lease_ttl_ms = 2000, clients = 8;
  int requests = 48;
  double settle_s = 2;
  std::string bin, model_dir, out;
};

std::string ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (i + 1 >= argc) return "unknown or incomplete argument: " + std::string(arg);
    const std::string_view v = argv[++i];
    struct IntFlag {
      const char* name;
      int* value;
      int lo, hi;
    };
    const IntFlag ints[] = {{"--nodes", &f->nodes, 2, 8},
                            {"--routers", &f->routers, 1, 8},
                            {"--kills", &f->kills, 0, 100},
                            {"--partitions", &f->partitions, 0, 100},
                            {"--lease-ttl-ms", &f->lease_ttl_ms, 1000, 60000},
                            {"--clients", &f->clients, 1, 256},
                            {"--requests", &f->requests, 1, 10000}};
    const IntFlag* hit = nullptr;
    for (const IntFlag& x : ints) hit = arg == x.name ? &x : hit;
    if (hit != nullptr) {
      if (!ParseFlagNumber<int>(v, hit->lo, hit->hi, hit->value)) {
        return std::string(arg) + ": want [" + std::to_string(hit->lo) + ", " +
               std::to_string(hit->hi) + "]";
      }
    } else if (arg == "--settle-s") {
      if (!ParseFlagNumber<double>(v, 0, 600, &f->settle_s)) return "--settle-s: want [0, 600]";
    } else if (arg == "--bin") {
      f->bin = v;
    } else if (arg == "--model-dir") {
      f->model_dir = v;
    } else if (arg == "--out") {
      f->out = v;
    } else {
      return "unknown argument: " + std::string(arg);
    }
  }
  return "";
}

struct FleetFault {
  std::string kind = {};  // "kill" or "partition"
  int node = 0;
  double at_s = 0, dropped_ms = -1, rejoined_ms = -1, reroute_ms = -1;
  int calls = 0;  // calls in flight at the fault or sent before the node was dropped
  std::string error = {};
};

// Runs one fault on `f.node` while `load` runs: the signals, the routers dropping the node,
// its return.
Status RunFault(FleetStack& stack, const FleetLoad& load, int ttl_ms, FleetFault* f) {
  const milliseconds drop_limit(ttl_ms + 15000);
  std::vector<pid_t> pids;
  if (f->kind == "partition") {
    BATON_ASSIGN_OR_RETURN(pids, stack.NodePids(f->node));
  }
  f->at_s = load.Now();
  if (f->kind == "kill") {
    BATON_RETURN_IF_ERROR(stack.KillNode(f->node));
  } else {
    for (pid_t p : pids) ::kill(p, SIGSTOP);
  }
  const Status dropped = stack.WaitListed(f->node, false, drop_limit);
  f->dropped_ms = (load.Now() - f->at_s) * 1e3;
  if (f->kind == "kill") {
    BATON_RETURN_IF_ERROR(dropped);
    BATON_RETURN_IF_ERROR(stack.RestartNode(f->node));
  } else {
    for (pid_t p : pids) ::kill(p, SIGCONT);
    BATON_RETURN_IF_ERROR(dropped);
  }
  BATON_RETURN_IF_ERROR(stack.WaitListed(f->node, true, milliseconds(60000)));
  f->rejoined_ms = (load.Now() - f->at_s) * 1e3;
  return OkStatus();
}

// The longest wait of any call the fault touched (see the file comment), in ms.
void MeasureReroute(const std::vector<FleetSample>& samples, FleetFault* f) {
  const double until = f->at_s + f->dropped_ms / 1e3;
  for (const FleetSample& s : samples) {
    if (s.sent_s > until) continue;
    const double gap = GapAfter(s, f->at_s);
    if (gap < 0) continue;
    ++f->calls;
    f->reroute_ms = std::max(f->reroute_ms, gap * 1e3);
  }
}

json RerouteStats(const std::vector<FleetFault>& faults, const std::string& kind) {
  std::vector<double> v;
  for (const FleetFault& f : faults) {
    if (f.kind == kind && f.reroute_ms >= 0) v.push_back(f.reroute_ms);
  }
  if (v.empty()) return {{"faults", 0}, {"reroute_ms_p50", nullptr}, {"reroute_ms_p99", nullptr}};
  return {{"faults", v.size()},
          {"reroute_ms_p50", Percentile(v, 50)},
          {"reroute_ms_p99", Percentile(v, 99)}};
}

json Ledger(const std::vector<FleetSample>& samples, const std::vector<Reference>& refs) {
  int ok = 0, lost = 0, failed = 0, mismatched = 0, duplicated = 0;
  for (const FleetSample& s : samples) {
    const LedgerEntry& e = s.entry;
    if (e.outcome != Outcome::kOk) {
      const bool answered = e.status != 0 && (e.status != 200 || !e.output.error.empty());
      ++(answered ? failed : lost);
      continue;
    }
    ++ok;
    const Reference& want = refs[s.request];
    if (e.output.token_ids == want.token_ids && e.output.text == want.text) continue;
    ++(RepeatsTokens(e.output.token_ids, want.token_ids) ? duplicated : mismatched);
  }
  return {{"invoked", samples.size()}, {"completed", ok},          {"lost", lost},
          {"failed", failed},          {"mismatched", mismatched}, {"duplicated", duplicated}};
}

std::vector<LoadRequest> StreamingRequests(int count) {
  std::vector<LoadRequest> out;
  for (LoadRequest& r : MakeLoadRequests(2 * count, 50, 16, 48, "tiny")) {
    if (!r.stream) continue;
    r.index = static_cast<int>(out.size());
    out.push_back(std::move(r));
  }
  return out;
}

json FaultJson(const FleetFault& f) {
  return {{"kind", f.kind},
          {"node", FleetStack::NodeName(f.node)},
          {"at_s", f.at_s},
          {"dropped_ms", f.dropped_ms},
          {"rejoined_ms", f.rejoined_ms},
          {"reroute_ms", f.reroute_ms},
          {"calls", f.calls},
          {"error", f.error.empty() ? json(nullptr) : json(f.error)}};
}

int Run(const Flags& flags) {
  Result<WorkDir> work = WorkDir::Make(kName, flags.out);
  if (!work.ok()) return FailRun(kName, work.status());
  const std::string model_dir = flags.model_dir.empty() ? work->path() + "/model" : flags.model_dir;
  if (Result<ModelSummary> m = EnsureTinyModel(model_dir); !m.ok()) {
    return FailRun(kName, m.status(), *work);
  }
  Result<std::unique_ptr<FleetStack>> stack =
      FleetStack::Start({.bin_dir = flags.bin,
                         .model_dir = model_dir,
                         .work_dir = work->path(),
                         .nodes = flags.nodes,
                         .routers = flags.routers,
                         .lease_ttl_ms = flags.lease_ttl_ms});
  if (!stack.ok()) return FailRun(kName, stack.status(), *work);
  const std::vector<LoadRequest> requests = StreamingRequests(flags.requests);
  int repeat_mismatches = 0;
  Result<std::vector<Reference>> refs =
      ReferenceRun((*stack)->RouterAddresses()[0], requests, &repeat_mismatches);
  if (!refs.ok()) return FailRun(kName, refs.status(), *work);

  FleetLoad load((*stack)->RouterAddresses(), requests, flags.clients);
  load.Start();
  std::this_thread::sleep_for(milliseconds(2000));
  const double steady_at[] = {0.5, 1.0, 1.5};
  std::vector<FleetFault> faults;
  for (int k = 0; k < flags.kills + flags.partitions; ++k) {
    const bool kill = (k % 2 == 0 && k / 2 < flags.kills) || k / 2 >= flags.partitions;
    FleetFault f{.kind = kill ? "kill" : "partition", .node = k % flags.nodes};
    if (Status s = RunFault(**stack, load, flags.lease_ttl_ms, &f); !s.ok()) f.error = s.ToString();
    faults.push_back(f);
    std::fprintf(stderr, "%s: %s of %s: dropped after %.0f ms, back after %.0f ms%s%s\n", kName,
                 f.kind.c_str(), FleetStack::NodeName(f.node).c_str(), f.dropped_ms, f.rejoined_ms,
                 f.error.empty() ? "" : ": ", f.error.c_str());
    if (!f.error.empty()) break;
    std::this_thread::sleep_for(milliseconds(static_cast<int>(flags.settle_s * 1000)));
  }
  load.Stop();
  const std::vector<FleetSample> samples = load.Samples();
  for (FleetFault& f : faults) MeasureReroute(samples, &f);
  double steady_max = 0;
  for (double at : steady_at) {
    FleetFault probe{.at_s = at, .dropped_ms = 0};
    MeasureReroute(samples, &probe);
    steady_max = std::max(steady_max, probe.reroute_ms);
  }

  json result = Ledger(samples, *refs);
  const json kills = RerouteStats(faults, "kill");
  const json partitions = RerouteStats(faults, "partition");
  result["reroute_ms_p50"] = kills["reroute_ms_p50"];
  result["reroute_ms_p99"] = kills["reroute_ms_p99"];
  result["partition"] = partitions;
  result["lease_ttl_ms"] = flags.lease_ttl_ms;
  result["steady_gap_ms_max"] = steady_max;
  result["nodes"] = flags.nodes;
  result["routers"] = flags.routers;
  result["clients"] = flags.clients;
  result["reference_repeat_mismatches"] = repeat_mismatches;
  json list = json::array();
  bool errors = false;
  for (const FleetFault& f : faults) {
    list.push_back(FaultJson(f));
    errors = errors || !f.error.empty();
  }
  result["faults"] = list;
  const double bound = flags.lease_ttl_ms + kSlackMs;
  auto within = [bound](const json& stats) {
    return stats["reroute_ms_p99"].is_null() || stats["reroute_ms_p99"].get<double>() <= bound;
  };
  result["meets_targets"] = !errors && result["lost"] == 0 && result["failed"] == 0 &&
                            result["mismatched"] == 0 && within(kills) && within(partitions);
  result["ok"] = !errors;
  if (errors || !result["meets_targets"].get<bool>()) work->Keep();
  // Named only when it stays: a temporary folder is removed when the run ends well.
  result["out"] = work->kept() ? json(work->path()) : json(nullptr);
  if (Status s = EmitResult(result, work->kept() ? work->path() : "", "fleet.json"); !s.ok()) {
    return FailRun(kName, s, *work);
  }
  return errors ? 1 : 0;
}

}  // namespace
}  // namespace baton

int main(int argc, char** argv) {
  return baton::perf::RunPerfDriver<baton::Flags>(argc, argv, baton::kName, baton::kUsage,
                                                  baton::ParseFlags, baton::Run);
}
