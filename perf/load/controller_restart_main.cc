// baton-perf-controller-restart: a steady load through baton-router while the controller is
// killed with kill -9 again and again and restarted at once (as systemd's Restart=always or
// `make serve` would): no request lost, none changed, no weight read again, no engine replaced.
//
//   baton-perf-controller-restart [--duration-s S] [--rps R] [--kills N] [--seed X]
//                                 [--clients C] [--cold-trials T] [--bin DIR]
//                                 [--model-dir DIR] [--large-model-dir DIR|none] [--out DIR]
//
// Stack: baton-controller with a primary and a standby baton-refengine on baton-mkmodel's tiny
// preset (written into --model-dir, or DIR/model), 1024 pool blocks of 64 KiB, baton-keeper,
// and a baton-router subscribed to the controller's socket. Requests: S x R (default 60 s x
// 50/s), the request list of baton-perf-failover-load (half streamed, half chat, fixed seeds),
// first once without faults (the reference), then under the faults. N kills (default 12) at
// seeded random moments spread over the load (restart_faults.h): every fourth one during a
// failover, the one after the middle during a canary step, the others plain.
//
// The last line of stdout is one JSON object: invoked, ok, lost (no answer or a broken
// stream), failed (any non-200), mismatched (an output that differs from the reference),
// weights_reloaded (bytes the restarted controllers read from the model files, by their own
// count; controller_read_bytes_max is what /proc/<pid>/io says of the worst one),
// engines_replaced (engine processes that exited other than by the faults' own doing),
// readopt_ms_p50/p99 (spawn of the new controller to the pair ready with the same engines),
// the per-kill detail, and cold_restart_ms (p50 of T trials, default 3, of today's behaviour:
// the controller, its engines and baton-keeper all killed, a new controller spawned, to a
// ready pair). meets_targets checks lost, failed, mismatched, weights_reloaded and
// engines_replaced are 0 and readopt_ms_p50 is at most 50. With --large-model-dir, `large`
// repeats the restart without load on that model (a pair of 2 MiB blocks): readopt_ms_p50 and
// cold_restart_ms of T trials each, and their ratio. A per-kill number that a fault does not
// have (readopt_ms of during_failover, every number of a kill that failed) is null. DIR keeps
// the logs and controller_restart.json; without --out they go to a new directory under /tmp,
// removed at the end unless the run failed or missed a target (`out` names it, else null).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "perf/driver_main.h"
#include "perf/load/failover_load_ledger.h"
#include "perf/load/failover_load_run.h"
#include "perf/load/load_procs.h"
#include "perf/load/restart_faults.h"
#include "perf/pair/failover_procs.h"

namespace baton {
namespace {

using namespace ::baton::perf;  // NOLINT: the driver's vocabulary
using nlohmann::json;
using std::chrono::milliseconds;

constexpr char kUsage[] =
    "usage: baton-perf-controller-restart [--duration-s S] [--rps R] [--kills N] [--seed X]\n"
    "                                     [--clients C] [--cold-trials T] [--bin DIR]\n"
    "                                     [--model-dir DIR] [--large-model-dir DIR|none]\n"
    "                                     [--out DIR]\n";
constexpr char kServedName[] = "tiny";
constexpr double kReadoptTargetMs = 50;

struct Flags {
  double duration_s = 60, rps = 50;
  int kills = 12, clients = 160, cold_trials = 3;
  uint64_t seed = 1;
  std::string bin, model_dir, out;
  std::string large_model_dir;  // "": no comparison on a large model
};

std::string ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (i + 1 >= argc) return "unknown or incomplete argument: " + std::string(arg);
    const std::string_view v = argv[++i];
    if (arg == "--duration-s") {
      if (!ParseFlagNumber<double>(v, 5, 86400, &f->duration_s))
        return "--duration-s: want [5, 86400]";
    } else if (arg == "--rps") {
      if (!ParseFlagNumber<double>(v, 0.1, 100000, &f->rps)) return "--rps: want (0, 100000]";
    } else if (arg == "--kills") {
      if (!ParseFlagNumber<int>(v, 1, 1000, &f->kills)) return "--kills: want [1, 1000]";
    } else if (arg == "--seed") {
      if (!ParseFlagNumber<uint64_t>(v, 0, UINT64_MAX, &f->seed)) return "--seed: want a number";
    } else if (arg == "--clients") {
      if (!ParseFlagNumber<int>(v, 1, 4096, &f->clients)) return "--clients: want [1, 4096]";
    } else if (arg == "--cold-trials") {
      if (!ParseFlagNumber<int>(v, 0, 100, &f->cold_trials)) return "--cold-trials: want [0, 100]";
    } else if (arg == "--bin") {
      f->bin = v;
    } else if (arg == "--model-dir") {
      f->model_dir = v;
    } else if (arg == "--large-model-dir") {
      f->large_model_dir = v == "none" ? "" : std::string(v);
    } else if (arg == "--out") {
      f->out = v;
    } else {
      return "unknown argument: " + std::string(arg);
    }
  }
  if (f->duration_s < 4.0 * f->kills) return "--duration-s: at least 4 s per kill";
  return "";
}

// N kills spread over the load: slot k of N, at a seeded random moment inside its slot
// (kept 1 s from its edges, 4 s from the start for the canary's set-up).
std::vector<RestartFault> PlanFaults(const Flags& flags) {
  uint64_t state = flags.seed * 0x9e3779b97f4a7c15ull + 1;
  auto uniform = [&] {  // splitmix64 -> [0, 1)
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return static_cast<double>((z ^ (z >> 31)) >> 11) / 9007199254740992.0;
  };
  const double slot = (flags.duration_s - 2) / flags.kills;
  std::vector<RestartFault> faults;
  for (int k = 0; k < flags.kills; ++k) {
    RestartFault f;
    f.kind = k == flags.kills / 2 ? "during_canary" : k % 4 == 3 ? "during_failover" : "plain";
    const double lo = 1 + k * slot + 1, hi = 1 + (k + 1) * slot - 1;
    f.at_s =
        std::max(f.kind == "during_canary" ? 4.0 : 1.0, lo + uniform() * std::max(0.0, hi - lo));
    faults.push_back(f);
  }
  return faults;
}

// A measurement, or null for one the fault did not have (-1 in RestartFault).
json MeasuredOrNull(double v) { return v < 0 ? json(nullptr) : json(v); }

json FaultJson(const RestartFault& f) {
  return {{"kind", f.kind},
          {"killed_s", MeasuredOrNull(f.killed_s)},
          {"readopt_ms", MeasuredOrNull(f.readopt_ms)},
          {"ready_ms", MeasuredOrNull(f.ready_ms)},
          {"self_readopt_ms", MeasuredOrNull(f.self_readopt_ms)},
          {"same_engines", f.same_engines},
          {"weights_bytes_read", f.weights_bytes_read},
          {"io_read_bytes", f.io_read_bytes},
          {"engines_exited", f.exited},
          {"engines_exited_by_the_fault", f.expected},
          {"error", f.error}};
}

// Counts of the ledger: ok, lost (no complete answer), failed (any non-200), mismatched.
json LedgerCounts(const std::vector<LedgerEntry>& entries, int load_count) {
  int invoked = 0, ok = 0, lost = 0, failed = 0, mismatched = 0, duplicated = 0;
  for (int i = 0; i < load_count; ++i) {
    const LedgerEntry& e = entries[i];
    if (!e.invoked) continue;
    ++invoked;
    ok += e.outcome == Outcome::kOk;
    lost += e.outcome == Outcome::kLost;
    failed += e.status != 200;
    mismatched += e.mismatched;
    duplicated += e.duplicated;
  }
  return {{"invoked", invoked},
          {"ok", ok},
          {"lost", lost},
          {"failed", failed},
          {"mismatched", mismatched + duplicated}};
}

Result<json> Measure(const Flags& flags, const std::string& work) {
  std::error_code ec;
  for (const char* old : {"controller.log", "router.log", "engines", "keeper.log", "state"}) {
    std::filesystem::remove_all(work + "/" + old, ec);
  }
  const std::string model_dir = flags.model_dir.empty() ? work + "/model" : flags.model_dir;
  BATON_ASSIGN_OR_RETURN(ModelSummary model, EnsureTinyModel(model_dir));
  (void)model;
  BATON_ASSIGN_OR_RETURN(ControllerPair pair,
                         ControllerPair::Start(flags.bin, model_dir, work, {kServedName}));
  BATON_ASSIGN_OR_RETURN(
      ServingProcess router,
      StartRouterProcess(flags.bin, {"--controller", pair.socket()}, work + "/router.log"));
  const int count = std::max(1, static_cast<int>(flags.duration_s * flags.rps));
  const std::vector<LoadRequest> requests = MakeLoadRequests(count, flags.rps, 16, 32, kServedName);
  int repeat_mismatches = 0;
  std::fprintf(stderr, "reference run of %d requests\n", count);
  BATON_ASSIGN_OR_RETURN(std::vector<Reference> refs,
                         ReferenceRun(router.address, requests, &repeat_mismatches));
  std::vector<RestartFault> faults = PlanFaults(flags);
  std::vector<LedgerEntry> entries(requests.size());
  std::fprintf(stderr, "load: %.0f s at %.0f/s with %d kills of the controller\n", flags.duration_s,
               flags.rps, flags.kills);
  RunRestartLoad(router.address, requests, count, flags.clients, pair, &faults, &entries);
  CompareWithReference(refs, &entries);
  json result = LedgerCounts(entries, count);

  std::vector<double> readopt, self;
  uint64_t reloaded = 0, io_max = 0;
  int replaced = 0, errors = 0;
  json detail = json::array();
  for (const RestartFault& f : faults) {
    if (f.readopt_ms >= 0) readopt.push_back(f.readopt_ms);
    if (f.self_readopt_ms >= 0) self.push_back(f.self_readopt_ms);
    reloaded += f.weights_bytes_read;
    io_max = std::max(io_max, f.io_read_bytes);
    replaced += std::max(0, f.exited - f.expected);
    errors += !f.error.empty();
    detail.push_back(FaultJson(f));
  }
  std::vector<double> cold;
  for (int t = 0; t < flags.cold_trials; ++t) {
    Result<double> ms = ColdRestart(pair, work);
    if (!ms.ok()) return ms.status().WithContext("cold restart");
    cold.push_back(*ms);
  }
  result.update({{"kills", faults.size()},
                 {"kill_errors", errors},
                 {"weights_reloaded", reloaded},
                 {"controller_read_bytes_max", io_max},
                 {"engines_replaced", replaced},
                 {"readopt_ms_p50", Percentile(readopt, 50)},
                 {"readopt_ms_p99", Percentile(readopt, 99)},
                 {"readopt_samples", readopt.size()},
                 {"self_readopt_ms_p50", Percentile(self, 50)},
                 {"cold_restart_ms", Percentile(cold, 50)},
                 {"cold_restart_trials", cold},
                 {"faults", detail},
                 {"duration_s", flags.duration_s},
                 {"rps", flags.rps},
                 {"seed", flags.seed},
                 {"model", "tiny"},
                 {"reference_repeat_mismatches", repeat_mismatches},
                 {"out", work}});
  json targets = {
      {"lost", result["lost"] == 0},
      {"failed", result["failed"] == 0},
      {"mismatched", result["mismatched"] == 0},
      {"weights_reloaded", reloaded == 0},
      {"engines_replaced", replaced == 0},
      {"readopt_ms_p50", !readopt.empty() && Percentile(readopt, 50) <= kReadoptTargetMs},
      {"every_kill_recovered", errors == 0}};
  bool all = true;
  for (const auto& [name, ok] : targets.items()) all = all && ok.get<bool>();
  targets["all"] = all;
  result["meets_targets"] = targets;
  router.process.Stop(std::chrono::seconds(5));
  pair.Stop();
  return result;
}

// The same comparison without load on a large model (perf/controller_restart writes a 4.3 GB
// one): what a kill -9 of the controller costs when the weights are kept, and when not.
Result<json> MeasureLarge(const Flags& flags, const std::string& work) {
  std::error_code ec;
  std::filesystem::remove_all(work, ec);
  std::filesystem::create_directories(work, ec);
  const PairConfig config{.served_name = "large", .pool_blocks = 64, .block_bytes = 2 << 20};
  BATON_ASSIGN_OR_RETURN(ControllerPair pair,
                         ControllerPair::Start(flags.bin, flags.large_model_dir, work, config));
  std::vector<double> readopt, cold;
  for (int t = 0; t < std::max(1, flags.cold_trials); ++t) {
    BATON_ASSIGN_OR_RETURN(double ms, PlainRestart(pair));
    readopt.push_back(ms);
  }
  for (int t = 0; t < std::max(1, flags.cold_trials); ++t) {
    BATON_ASSIGN_OR_RETURN(double ms, ColdRestart(pair, work));
    cold.push_back(ms);
  }
  uint64_t bytes = 0;
  for (const auto& entry : std::filesystem::directory_iterator(flags.large_model_dir, ec)) {
    if (entry.is_regular_file()) bytes += entry.file_size();
  }
  pair.Stop();
  return json{
      {"model_dir", flags.large_model_dir},
      {"model_bytes", bytes},
      {"readopt_ms_p50", Percentile(readopt, 50)},
      {"readopt_trials", readopt},
      {"cold_restart_ms", Percentile(cold, 50)},
      {"cold_restart_trials", cold},
      {"cold_over_readopt", Percentile(cold, 50) / std::max(0.001, Percentile(readopt, 50))}};
}

int Run(const Flags& flags) {
  Result<WorkDir> work = WorkDir::Make("baton-perf-controller-restart", flags.out);
  if (!work.ok()) return FailRun("baton-perf-controller-restart", work.status());
  Result<json> result = Measure(flags, work->path());
  if (!result.ok()) return FailRun("baton-perf-controller-restart", result.status(), *work);
  if (!flags.large_model_dir.empty()) {
    Result<json> large = MeasureLarge(flags, work->path() + "/large");
    if (!large.ok()) return FailRun("baton-perf-controller-restart", large.status(), *work);
    (*result)["large"] = *large;
    std::fprintf(stderr, "large model: readopt %.1f ms, cold restart %.1f ms\n",
                 (*large)["readopt_ms_p50"].get<double>(),
                 (*large)["cold_restart_ms"].get<double>());
  }
  // A temporary folder stays only when the run missed a target (its logs say why); the JSON
  // names no folder that is gone.
  if (!(*result)["meets_targets"].value("all", false)) work->Keep();
  if (!work->kept()) (*result)["out"] = nullptr;
  const json& r = *result;
  std::printf(
      "invoked %d: lost %d, failed %d, mismatched %d; %zu kills, weights reloaded %llu bytes, "
      "engines replaced %d; readopt p50 %.1f ms, p99 %.1f ms; cold restart %.1f ms\n",
      r["invoked"].get<int>(), r["lost"].get<int>(), r["failed"].get<int>(),
      r["mismatched"].get<int>(), r["kills"].get<size_t>(),
      static_cast<unsigned long long>(r["weights_reloaded"].get<uint64_t>()),
      r["engines_replaced"].get<int>(), r["readopt_ms_p50"].get<double>(),
      r["readopt_ms_p99"].get<double>(), r["cold_restart_ms"].get<double>());
  if (Status s = EmitResult(r, work->kept() ? work->path() : "", "controller_restart.json");
      !s.ok()) {
    return FailRun("baton-perf-controller-restart", s, *work);
  }
  return 0;
}

}  // namespace
}  // namespace baton

int main(int argc, char** argv) {
  return baton::perf::RunPerfDriver<baton::Flags>(argc, argv, "baton-perf-controller-restart",
                                                  baton::kUsage, baton::ParseFlags, baton::Run);
}
