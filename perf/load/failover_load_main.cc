// baton-perf-failover-load: a steady load through baton-router while the primary is killed
// and then hung; a client ledger of every request, every output compared with a run
// without failures.
//
//   baton-perf-failover-load [--duration-s S] [--rps R] [--kill-at-s K] [--hang-at-s H]
//                            [--window-s W] [--min-tokens A] [--max-tokens B] [--clients C]
//                            [--upgrade-at-s U] [--bad-upgrade-at-s B]
//                            [--bin DIR] [--model-dir DIR] [--out DIR]
//
// Stack: baton-controller with a primary and a standby baton-refengine on baton-mkmodel's
// tiny preset (written into --model-dir, or DIR/model, reused while it matches), 1024 pool
// blocks of 64 KiB, and a baton-router subscribed to the controller's socket.
// Requests: S x R of them (default 30 s x 50/s), started on a fixed schedule (open loop:
// request i at i/R s, whatever the others are doing) by up to C concurrent clients (default
// 160, each with one keep-alive connection); every other one streams, and of each kind every
// other pair is a chat completion (`chat` in the JSON counts them); fixed prompts and seeds,
// temperature 0.8, max_tokens from A to B (default 16..32).
// First the reference: the same request list through the same stack with no fault. Then the
// load, with kill -9 of the primary at K s (default S/3) and SIGSTOP of the next primary at
// H s (default 2S/3); "none" skips a fault. Upgrade faults, off unless asked: at U s
// `batonctl upgrade` to the same engine with another version label (it must be promoted), at
// B s to one that answers every completion 500 (it must be rolled back); canary steps 10, 50
// and 100 % of 2 s each, at least 20 requests a step. Each signal is sent with kill(2) to the pid
// that `batonctl --json status` names, in the middle of the fault's probe: one more streaming
// request (max_tokens 384, a seed that runs long; a chat completion for every other fault,
// the hang's by default) sent at the fault's time, signalled once its
// first events have reached the client (failover_load_run.h). A tiny-model request takes a few ms,
// and a fault that lands between requests would test nothing but the queue.
//
// Ledger (failover_load_ledger.h): invoked = ok + rejected (429) + lost; duplicated and
// mismatched compare each ok output with its reference. Latency runs from the scheduled
// start to the last byte; steady_p99_ms is over ok requests outside every fault window,
// failover_p99_ms over those in flight or started within W s (default 2) after a fault.
// The last line of stdout is one JSON object with these, the per-fault detail (the probe's
// fate, the controller's promotion timeline) and router_replays (the router's own
// baton_router_replays_total by kind, when it has one); meets_targets checks lost,
// duplicated and mismatched are 0, failover_p99_ms <= steady_p99_ms + 1000, and that each
// upgrade ended as it should (the controller's record is in the fault's `upgrade`). DIR keeps
// the logs, ledger.jsonl, router_metrics.txt, failover_load.json and the plot
// failover_load.png; without --out they go to a new directory under /tmp, removed at the end
// unless the run failed or missed a target (then kept, and named in the JSON as `out`; `out`
// and `plot` are null when it was removed).
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "base/clock.h"
#include "perf/driver_main.h"
#include "perf/load/failover_load_ledger.h"
#include "perf/load/failover_load_run.h"
#include "perf/load/load_client.h"
#include "perf/load/load_procs.h"

namespace baton {
namespace {

using namespace ::baton::perf;  // NOLINT: the driver's vocabulary
using nlohmann::json;
using std::chrono::milliseconds;

constexpr char kUsage[] =
    "usage: baton-perf-failover-load [--duration-s S] [--rps R] [--kill-at-s K|none]\n"
    "                                [--hang-at-s H|none] [--window-s W] [--min-tokens A]\n"
    "                                [--max-tokens B] [--clients C] [--upgrade-at-s U|none]\n"
    "                                [--bad-upgrade-at-s U|none] [--bin DIR]\n"
    "                                [--model-dir DIR] [--out DIR]\n";
constexpr char kServedName[] = "tiny";
constexpr double kFailoverSlackMs = 1000;

struct Flags {
  double duration_s = 30, rps = 50, kill_at_s = -2, hang_at_s = -2, window_s = 2;
  double upgrade_at_s = -1, bad_upgrade_at_s = -1;  // none unless asked
  int min_tokens = 16, max_tokens = 32, clients = 160;
  std::string bin, model_dir, out;
};

std::string ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (i + 1 >= argc) return "unknown or incomplete argument: " + std::string(arg);
    const std::string_view v = argv[++i];
    double* fault = arg == "--kill-at-s"          ? &f->kill_at_s
                    : arg == "--hang-at-s"        ? &f->hang_at_s
                    : arg == "--upgrade-at-s"     ? &f->upgrade_at_s
                    : arg == "--bad-upgrade-at-s" ? &f->bad_upgrade_at_s
                                                  : nullptr;
    if (fault != nullptr) {
      if (v == "none") {
        *fault = -1;
      } else if (!perf::ParseFlagNumber<double>(v, 0, 86400, fault)) {
        return std::string(arg) + ": want seconds >= 0 or none";
      }
    } else if (arg == "--duration-s") {
      if (!perf::ParseFlagNumber<double>(v, 0.1, 86400, &f->duration_s))
        return "--duration-s: want (0, 86400]";
    } else if (arg == "--rps") {
      if (!perf::ParseFlagNumber<double>(v, 0.1, 100000, &f->rps)) return "--rps: want (0, 100000]";
    } else if (arg == "--window-s") {
      if (!perf::ParseFlagNumber<double>(v, 0, 3600, &f->window_s))
        return "--window-s: want [0, 3600]";
    } else if (arg == "--min-tokens") {
      if (!perf::ParseFlagNumber<int>(v, 1, 400, &f->min_tokens))
        return "--min-tokens: want [1, 400]";
    } else if (arg == "--max-tokens") {
      if (!perf::ParseFlagNumber<int>(v, 1, 400, &f->max_tokens))
        return "--max-tokens: want [1, 400]";
    } else if (arg == "--clients") {
      if (!perf::ParseFlagNumber<int>(v, 1, 4096, &f->clients)) return "--clients: want [1, 4096]";
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
  if (f->min_tokens > f->max_tokens) return "--min-tokens is above --max-tokens";
  if (f->kill_at_s == -2) f->kill_at_s = f->duration_s / 3;
  if (f->hang_at_s == -2) f->hang_at_s = 2 * f->duration_s / 3;
  return "";
}

// The controller's timeline of the failover that followed each fault (matched by pid).
void AttachTimelines(const ControllerPair& pair, std::vector<Fault>* faults) {
  Result<json> t = pair.Ctl({"timeline"});
  if (!t.ok() || !t->contains("history")) return;
  for (Fault& f : *faults) {
    for (const json& record : t->at("history")) {
      if (f.pid > 0 && record.value("old_pid", 0) == f.pid) f.promotion = record;
    }
  }
}

// Each upgrade fault's end as the controller recorded it (the upgrade history, in order);
// true when every good build was promoted and every broken one rolled back.
bool AttachUpgrades(const ControllerPair& pair, std::vector<Fault>* faults) {
  Result<json> s = pair.Ctl({"status"});
  const json history =
      s.ok() ? s->value("upgrade", json::object()).value("history", json::array()) : json::array();
  bool ok = true;
  size_t next = 0;
  for (Fault& f : *faults) {
    if (f.kind != "upgrade" && f.kind != "bad_upgrade") continue;
    if (next < history.size()) f.upgrade = history[next++];
    const char* want = f.kind == "upgrade" ? "promoted" : "rolled_back";
    ok = ok && !f.upgrade.is_null() && f.upgrade.value("outcome", "") == want;
  }
  return ok;
}

// The router's own count of attempts after an engine failed, by kind (from
// baton_router_replays_total in its /metrics, which is kept in `keep`); null if absent.
json RouterReplays(const std::string& router, const std::string& keep) {
  LoadClient client(router, std::chrono::seconds(5));
  const std::string text = client.Get("/metrics").body;
  std::ofstream(keep) << text;
  const std::string prefix = "baton_router_replays_total{kind=\"";
  json out = nullptr;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(prefix, 0) != 0) continue;
    const size_t quote = line.find('"', prefix.size());
    const size_t space = line.rfind(' ');
    if (quote == std::string::npos || space == std::string::npos) continue;
    out[line.substr(prefix.size(), quote - prefix.size())] = std::atof(line.c_str() + space + 1);
  }
  return out;
}

// The chat completions of the load: how many, and their outcomes.
json ChatCounts(const std::vector<LoadRequest>& requests, const std::vector<LedgerEntry>& entries) {
  int n = 0, ok = 0, lost = 0, mismatched = 0;
  for (size_t i = 0; i < requests.size() && i < entries.size(); ++i) {
    if (!requests[i].chat || !entries[i].invoked) continue;
    ++n;
    ok += entries[i].outcome == Outcome::kOk;
    lost += entries[i].outcome == Outcome::kLost;
    mismatched += entries[i].mismatched;
  }
  return {{"requests", n}, {"ok", ok}, {"lost", lost}, {"mismatched", mismatched}};
}

Result<json> Measure(const Flags& flags, const std::string& work) {
  std::error_code ec;  // this run's logs start empty (the processes append to them)
  for (const char* old : {"controller.log", "router.log", "engines", "gnuplot.log"}) {
    std::filesystem::remove_all(work + "/" + old, ec);
  }
  const std::string model_dir = flags.model_dir.empty() ? work + "/model" : flags.model_dir;
  BATON_ASSIGN_OR_RETURN(ModelSummary model, EnsureTinyModel(model_dir));
  std::fprintf(stderr, "%s tiny model in %s\n", model.reused ? "reused" : "wrote",
               model_dir.c_str());
  BATON_ASSIGN_OR_RETURN(ControllerPair pair,
                         ControllerPair::Start(flags.bin, model_dir, work, {kServedName}));
  BATON_ASSIGN_OR_RETURN(
      ServingProcess router,
      StartRouterProcess(flags.bin, {"--controller", pair.socket()}, work + "/router.log"));
  std::vector<Fault> faults;
  for (const auto& [kind, at] :
       {std::pair{"kill", flags.kill_at_s}, std::pair{"hang", flags.hang_at_s},
        std::pair{"upgrade", flags.upgrade_at_s},
        std::pair{"bad_upgrade", flags.bad_upgrade_at_s}}) {
    if (at < 0) continue;
    Fault f;
    f.kind = kind;
    f.at_s = at;
    faults.push_back(f);
  }
  std::sort(faults.begin(), faults.end(),
            [](const Fault& a, const Fault& b) { return a.at_s < b.at_s; });
  const int count = std::max(1, static_cast<int>(flags.duration_s * flags.rps));
  std::vector<LoadRequest> requests =
      MakeLoadRequests(count, flags.rps, flags.min_tokens, flags.max_tokens, kServedName);
  BATON_ASSIGN_OR_RETURN(std::vector<uint64_t> probe_seeds,
                         ProbeSeeds(router.address, kServedName, static_cast<int>(faults.size())));
  for (size_t k = 0; k < faults.size(); ++k) {
    faults[k].probe = static_cast<int>(requests.size());
    requests.push_back(MakeProbeRequest(faults[k].probe, faults[k].at_s, probe_seeds[k],
                                        kServedName, ProbeIsChat(static_cast<int>(k))));
  }
  std::fprintf(stderr, "router %s, controller %s; reference run of %zu requests\n",
               router.address.c_str(), pair.socket().c_str(), requests.size());
  int repeat_mismatches = 0;
  BATON_ASSIGN_OR_RETURN(std::vector<Reference> refs,
                         ReferenceRun(router.address, requests, &repeat_mismatches));
  BATON_RETURN_IF_ERROR(pair.WaitReady(milliseconds(60000)).status());

  std::fprintf(stderr, "load: %.1f s at %.1f requests/s, %d clients\n", flags.duration_s, flags.rps,
               flags.clients);
  std::vector<LedgerEntry> entries(requests.size());
  RunLoad(router.address, requests, count, flags.clients, pair, &faults, &entries);
  const bool ready_after = pair.WaitReady(milliseconds(60000)).ok();
  AttachTimelines(pair, &faults);
  const bool upgrades_ok = AttachUpgrades(pair, &faults);
  const json replays = RouterReplays(router.address, work + "/router_metrics.txt");
  CompareWithReference(refs, &entries);
  json result = Summarize(requests, entries, faults, flags.window_s);
  BATON_RETURN_IF_ERROR(WriteLedger(work + "/ledger.jsonl", requests, entries));
  char title[256];
  std::snprintf(title, sizeof(title),
                "baton-router failover load: %d requests at %.0f/s; ok %d, rejected %d, lost %d, "
                "mismatched %d, duplicated %d",
                result["invoked"].get<int>(), flags.rps, result["ok"].get<int>(),
                result["rejected"].get<int>(), result["lost"].get<int>(),
                result["mismatched"].get<int>(), result["duplicated"].get<int>());
  Result<std::string> png = PlotLatency(work, requests, entries, faults, title);
  result["plot"] = png.ok() ? json(*png) : json(nullptr);
  if (!png.ok()) result["plot_error"] = png.status().ToString();
  result.update(
      {{"duration_s", flags.duration_s},
       {"rps", flags.rps},
       {"window_s", flags.window_s},
       {"clients", flags.clients},
       {"model", "tiny"},
       {"max_tokens", {flags.min_tokens, flags.max_tokens}},
       {"stream_fraction", 0.5},
       {"chat_fraction", 0.5},
       {"chat", ChatCounts(requests, entries)},
       {"reference", {{"requests", requests.size()}, {"repeat_mismatches", repeat_mismatches}}},
       {"probes", faults.size()},
       {"pair_ready_after", ready_after},
       {"router_replays", replays},
       {"router_alive_after", router.process.Running()},
       {"out", work},
       {"p99", "nearest rank"}});
  const double steady = result["steady_p99_ms"], failover = result["failover_p99_ms"];
  json targets = {{"lost", result["lost"] == 0},
                  {"duplicated", result["duplicated"] == 0},
                  {"mismatched", result["mismatched"] == 0},
                  {"failover_p99_within_steady_plus_1000", failover <= steady + kFailoverSlackMs}};
  targets["upgrades_as_expected"] = upgrades_ok;
  targets["all"] = targets["lost"] && targets["duplicated"] && targets["mismatched"] &&
                   targets["failover_p99_within_steady_plus_1000"] && upgrades_ok;
  result["meets_targets"] = targets;
  router.process.Stop(std::chrono::seconds(5));
  const int code = pair.Stop();
  if (code != 0) std::fprintf(stderr, "baton-controller exited with %d\n", code);
  return result;
}

int Run(const Flags& flags) {
  Result<perf::WorkDir> work = perf::WorkDir::Make("baton-perf-failover-load", flags.out);
  if (!work.ok()) return perf::FailRun("baton-perf-failover-load", work.status());
  Result<json> result = Measure(flags, work->path());
  if (!result.ok()) return perf::FailRun("baton-perf-failover-load", result.status(), *work);
  // A temporary folder stays only when the run missed a target (its ledger and plot say why);
  // the JSON names no folder or file that is gone.
  if (!(*result)["meets_targets"].value("all", false)) work->Keep();
  if (!work->kept()) (*result)["out"] = (*result)["plot"] = nullptr;
  std::printf(
      "invoked %d: ok %d, rejected %d, lost %d; duplicated %d, mismatched %d; p99 steady %.1f "
      "ms, failover %.1f ms; plot %s\n",
      (*result)["invoked"].get<int>(), (*result)["ok"].get<int>(), (*result)["rejected"].get<int>(),
      (*result)["lost"].get<int>(), (*result)["duplicated"].get<int>(),
      (*result)["mismatched"].get<int>(), (*result)["steady_p99_ms"].get<double>(),
      (*result)["failover_p99_ms"].get<double>(),
      (*result)["plot"].is_string() ? (*result)["plot"].get<std::string>().c_str() : "none");
  if (Status s = perf::EmitResult(*result, work->kept() ? work->path() : "", "failover_load.json");
      !s.ok()) {
    return perf::FailRun("baton-perf-failover-load", s, *work);
  }
  return 0;
}

}  // namespace
}  // namespace baton

int main(int argc, char** argv) {
  return baton::perf::RunPerfDriver<baton::Flags>(argc, argv, "baton-perf-failover-load",
                                                  baton::kUsage, baton::ParseFlags, baton::Run);
}
