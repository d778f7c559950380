// baton-perf-failover-long: the time from kill -9 of the primary to the next token of
// long-context streams, with KV-warm failover (the new primary continues each interrupted
// request from the KV the dead one left in the pool) against today's replay (the new primary
// prefills the whole context again), on a small and a large generated model, in one run.
//
//   baton-perf-failover-long [--trials N] [--streams S] [--small-context T] [--large-context T]
//                            [--max-tokens G] [--cut-after K] [--threads K] [--bin DIR]
//                            [--small-dir DIR] [--large-dir DIR] [--out DIR]
//
// Models: perf/failover's two (perf/pair/failover_models.h; written once into the dirs).
// Per model and mode: a controller pair of baton-refengine (1 MiB pool blocks; the engines
// started with --kv-handoff on or off) and a baton-router in front; S streams (default 4) of
// T prompt tokens (default 800 on the small model, 300 on the large) and G generated
// (default 32), seeded (a seed whose undisturbed answer ends before G tokens is replaced, at
// most 8 times: a stream must not end before the kill); the primary is killed once every
// stream has K tokens (default 8); N trials (default 2) per mode. The undisturbed outputs come from
// one run first.
//
// The last line of stdout is one JSON object: per model (`small`, `large`) the p50 and p99
// of warm_next_token_after_kill_ms and reprefill_next_token_after_kill_ms (over every stream
// of every trial) and reprefill_over_warm (p50 over p50); `adopted` (sequences the new
// primaries adopted in the warm trials), `in_flight` (sequences running at those kills),
// `dropped` (in flight, not adopted), `mismatched` (streams whose text or token ids differ
// from the undisturbed run, both modes). meets_targets: mismatched 0, dropped 0,
// large.reprefill_over_warm at least 10.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "perf/driver_main.h"
#include "perf/kv/failover_long_run.h"
#include "perf/pair/failover_models.h"
#include "perf/pair/failover_procs.h"

namespace baton {
namespace {

using namespace ::baton::perf;  // NOLINT: the driver's vocabulary
using nlohmann::json;

constexpr char kUsage[] =
    "usage: baton-perf-failover-long [--trials N] [--streams S] [--small-context T]\n"
    "                                [--large-context T] [--max-tokens G] [--cut-after K]\n"
    "                                [--threads K] [--bin DIR] [--small-dir DIR]\n"
    "                                [--large-dir DIR] [--out DIR]\n";
constexpr double kRatioTarget = 10;

struct Flags {
  int trials = 2, streams = 4, small_context = 800, large_context = 300, max_tokens = 32;
  int cut_after = 8, threads = 2;
  std::string bin, out;
  std::string small_dir = ".cache/models/failover-small";
  std::string large_dir = ".cache/models/failover-large";
};

std::string ParseFlags(int argc, char** argv, Flags* f) {
  struct IntFlag {
    const char* name;
    int* value;
    int lo, hi;
  };
  const IntFlag ints[] = {{"--trials", &f->trials, 1, 100},
                          {"--streams", &f->streams, 1, 64},
                          {"--small-context", &f->small_context, 1, 1900},
                          {"--large-context", &f->large_context, 1, 1900},
                          {"--max-tokens", &f->max_tokens, 2, 1000},
                          {"--cut-after", &f->cut_after, 1, 999},
                          {"--threads", &f->threads, 1, 256}};
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (i + 1 >= argc) return "unknown or incomplete argument: " + std::string(arg);
    const std::string_view v = argv[++i];
    bool known = false;
    for (const IntFlag& flag : ints) {
      if (arg != flag.name) continue;
      known = true;
      if (!ParseFlagNumber<int>(v, flag.lo, flag.hi, flag.value)) {
        return std::string(flag.name) + ": want [" + std::to_string(flag.lo) + ", " +
               std::to_string(flag.hi) + "]";
      }
    }
    if (known) continue;
    if (arg == "--bin") {
      f->bin = v;
    } else if (arg == "--small-dir") {
      f->small_dir = v;
    } else if (arg == "--large-dir") {
      f->large_dir = v;
    } else if (arg == "--out") {
      f->out = v;
    } else {
      return "unknown argument: " + std::string(arg);
    }
  }
  if (f->cut_after >= f->max_tokens) return "--cut-after must be below --max-tokens";
  return "";
}

json ModeJson(const char* mode, const LongModeResult& r) {
  return {{std::string(mode) + "_next_token_after_kill_ms_p50", Percentile(r.next_token_ms, 50)},
          {std::string(mode) + "_next_token_after_kill_ms_p99", Percentile(r.next_token_ms, 99)}};
}

struct Totals {
  int adopted = 0, in_flight = 0, mismatched = 0;
};

Result<json> MeasureModel(const Flags& flags, const std::string& which, const std::string& dir,
                          int context, const std::string& work, Totals* totals) {
  std::fprintf(stderr, "%s model: %s, %d streams of %d prompt tokens\n", which.c_str(), dir.c_str(),
               flags.streams, context);
  BATON_RETURN_IF_ERROR(EnsureFailoverModel(which, dir).status());
  std::vector<LongRequest> requests = LongRequests(flags.streams, context, flags.max_tokens);
  std::vector<CompletionOutput> reference;
  json out = {{"context_tokens", context}, {"streams", flags.streams}, {"trials", flags.trials}};
  double p50[2] = {0, 0};
  for (int warm = 1; warm >= 0; --warm) {
    LongModeConfig c{.bin_dir = flags.bin,
                     .model_dir = dir,
                     .work_dir = work + "/" + which + (warm ? "-warm" : "-reprefill"),
                     .served_name = which,
                     .engine_threads = flags.threads,
                     .kv_handoff = warm == 1,
                     .trials = flags.trials,
                     .cut_after = flags.cut_after};
    BATON_ASSIGN_OR_RETURN(LongModeResult r, RunLongMode(c, &requests, &reference));
    out.update(ModeJson(warm ? "warm" : "reprefill", r));
    p50[warm] = Percentile(r.next_token_ms, 50);
    totals->mismatched += r.mismatched;
    if (warm) {
      totals->adopted += r.adopted;
      totals->in_flight += r.in_flight;
    }
  }
  out["reprefill_over_warm"] = p50[1] > 0 ? p50[0] / p50[1] : 0;
  return out;
}

int Run(const Flags& flags) {
  Result<WorkDir> work = WorkDir::Make("baton-perf-failover-long", flags.out);
  if (!work.ok()) return FailRun("baton-perf-failover-long", work.status());
  Totals totals;
  json result;
  const std::pair<const char*, std::pair<std::string, int>> models[] = {
      {"small", {flags.small_dir, flags.small_context}},
      {"large", {flags.large_dir, flags.large_context}}};
  for (const auto& [which, spec] : models) {
    Result<json> r = MeasureModel(flags, which, spec.first, spec.second, work->path(), &totals);
    if (!r.ok()) return FailRun("baton-perf-failover-long", r.status(), *work);
    result[which] = *r;
  }
  result["adopted"] = totals.adopted;
  result["in_flight"] = totals.in_flight;
  result["dropped"] = totals.in_flight - totals.adopted;
  result["mismatched"] = totals.mismatched;
  result["meets_targets"] = {
      {"mismatched", totals.mismatched == 0},
      {"dropped", totals.in_flight == totals.adopted},
      {"large_reprefill_over_warm",
       result["large"]["reprefill_over_warm"].get<double>() >= kRatioTarget}};
  for (const char* which : {"small", "large"}) {
    const json& m = result[which];
    std::fprintf(stderr,
                 "%s: next token after the kill p50 %.1f ms warm, %.1f ms reprefill (x%.1f)\n",
                 which, m["warm_next_token_after_kill_ms_p50"].get<double>(),
                 m["reprefill_next_token_after_kill_ms_p50"].get<double>(),
                 m["reprefill_over_warm"].get<double>());
  }
  if (Status s = EmitResult(result, flags.out, "failover_long.json"); !s.ok()) {
    return FailRun("baton-perf-failover-long", s, *work);
  }
  return 0;
}

}  // namespace
}  // namespace baton

int main(int argc, char** argv) {
  return baton::perf::RunPerfDriver<baton::Flags>(argc, argv, "baton-perf-failover-long",
                                                  baton::kUsage, baton::ParseFlags, baton::Run);
}
