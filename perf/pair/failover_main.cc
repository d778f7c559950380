// baton-perf-failover: how long a service is without its engine after kill -9, with Baton
// and with a cold restart, on a small and a large model in one run.
//
//   baton-perf-failover --small DIR --large DIR [--generate] [--trials N] [--bin DIR]
//                       [--threads K] [--pool-blocks B] [--prompt-tokens P] [--out DIR]
//                       [--epoch-reserve E] [--engine PROGRAM]
//
// --generate writes the two models (failover_models.h) into those directories first, or
// keeps them when they match.
// Per model:
//   baton  a baton-controller with a primary and a standby baton-refengine. Each trial
//          kills the primary with SIGKILL from this process, probes the standby's /health
//          over one keep-alive connection (200 us between probes) until it answers 200
//          (ready_ms: the promoted engine accepts requests), then sends a max_tokens=1
//          completion until its answer (first_token_ms). detect_ms is the kill to the
//          controller's "fenced" log line (CLOCK_REALTIME on both sides); fence_ms,
//          promote_ms, controller_ready_ms and teardown_ms (detected -> the old primary's
//          barrier passed: the promotion does not wait for it when it starts on the pool's
//          promotion reserve, counted in promoted_before_barrier) come from
//          `batonctl --json timeline`. The next
//          trial waits for the new standby. forward_pass_ms is the same max_tokens=1
//          request on a serving primary: 4 before the trials, and in each trial one sent to
//          the primary before the kill (after the same idle wait for a ready pair as the
//          first token after it; also forward_pass_before_kill_ms) and one right after the
//          first token, back to back (first_token_after_ready_ms is first_token_ms -
//          ready_ms; the target holds when its median is at most the slowest forward pass).
//          On this VM a step after an idle pause is slower than one right after another.
//   cold   a standalone baton-refengine that loads its own weights with plain reads, as a
//          typical engine does, from exec to the answer of the same request, with the
//          model's files in the page cache (read once before) or evicted (fadvise
//          DONTNEED, checked with mincore). Its KV cache holds as many tokens as the pool.
// The completion is greedy, max_tokens=1, with a prompt of --prompt-tokens token ids
// (default 1: one decode step, the shortest forward pass; prefill costs the same after a
// cold restart as after a promotion, and on a CPU it would hide what a failover costs).
// --threads sets the engines' compute threads (both kinds; default: the cores, at most 256).
// Ratios: cold_over_baton_large = cold (warm cache) first token / Baton first token;
// cold_over_baton_large_ready = cold (warm cache) listening / Baton ready; and
// baton_large_over_small = Baton ready, large / small (medians). Percentiles are
// nearest-rank: with fewer than 100 trials p99 is the maximum. The last line of stdout is
// one JSON object; meets_targets checks each acceptance target. --epoch-reserve sets the
// controllers' controller.epoch_reserve (default 64; 1 puts a journal fsync into every fence
// and promotion). --engine runs another engine program in both kinds, with the reference
// engine's flags (perf/failover_torch runs baton-torch-engine). Single-threaded driver.
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"
#include "perf/driver_main.h"
#include "perf/pair/failover_models.h"
#include "perf/pair/failover_procs.h"
#include "perf/pair/failover_trials.h"

namespace baton {
namespace {

using namespace ::baton::perf;  // NOLINT: the trials are this driver's vocabulary
using nlohmann::json;

constexpr char kUsage[] =
    "usage: baton-perf-failover --small DIR --large DIR [--generate] [--trials N] [--bin DIR]\n"
    "                           [--threads K] [--pool-blocks B] [--prompt-tokens P]\n"
    "                           [--out DIR] [--epoch-reserve E] [--engine PROGRAM]\n";
// The acceptance targets.
constexpr double kReadyP50Ms = 2, kReadyP99Ms = 5;
constexpr double kLargeOverSmallMax = 1.5, kColdOverBatonMin = 10;
constexpr int kForwardPasses = 5;

struct Flags {
  std::string small, large, bin, out, engine;
  int trials = 10, pool_blocks = 64, prompt_tokens = 1, epoch_reserve = 64;
  int threads = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 256u));
  bool generate = false;
};

std::string ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--generate") {
      f->generate = true;
      continue;
    }
    if (i + 1 >= argc) return "unknown or incomplete argument: " + std::string(arg);
    const std::string_view v = argv[++i];
    if (arg == "--small") {
      f->small = v;
    } else if (arg == "--large") {
      f->large = v;
    } else if (arg == "--bin") {
      f->bin = v;
    } else if (arg == "--out") {
      f->out = v;
    } else if (arg == "--engine") {
      f->engine = v;
    } else if (arg == "--trials") {
      if (!perf::ParseFlagNumber<int>(v, 1, 10000, &f->trials))
        return "--trials: not a number in [1, 10000]";
    } else if (arg == "--threads") {
      if (!perf::ParseFlagNumber<int>(v, 1, 256, &f->threads))
        return "--threads: not a number in [1, 256]";
    } else if (arg == "--prompt-tokens") {
      if (!perf::ParseFlagNumber<int>(v, 1, 1024, &f->prompt_tokens))
        return "--prompt-tokens: not a number in [1, 1024]";
    } else if (arg == "--epoch-reserve") {
      if (!perf::ParseFlagNumber<int>(v, 1, 1 << 20, &f->epoch_reserve))
        return "--epoch-reserve: not a number in [1, 1048576]";
    } else if (arg == "--pool-blocks") {
      if (!perf::ParseFlagNumber<int>(v, 2, 1 << 20, &f->pool_blocks))
        return "--pool-blocks: not a number >= 2";
    } else {
      return "unknown argument: " + std::string(arg);
    }
  }
  if (f->small.empty() || f->large.empty()) return "--small DIR and --large DIR are required";
  return "";
}

// Series of samples by name, summarized as NAME_p50 and NAME_p99.
using Series = std::map<std::string, std::vector<double>>;

void Summarize(const Series& series, json* out) {
  for (const auto& [name, v] : series) {
    if (v.empty()) continue;
    (*out)[name + "_p50"] = Percentile(v, 50);
    (*out)[name + "_p99"] = Percentile(v, 99);
  }
}

Status RunBaton(const Flags& flags, const ModelInfo& model, const PairOptions& opts, int* kv_tokens,
                Series* series, json* info) {
  BATON_ASSIGN_OR_RETURN(std::unique_ptr<BatonPair> pair, BatonPair::Start(model, opts));
  *kv_tokens = pair->block_tokens() * opts.pool_blocks;
  if (flags.prompt_tokens >= *kv_tokens) {
    return InvalidArgument("--prompt-tokens " + std::to_string(flags.prompt_tokens) +
                           " does not fit the pool's " + std::to_string(*kv_tokens) +
                           " KV tokens (raise --pool-blocks)");
  }
  (*info)["block_bytes"] = pair->block_bytes();
  (*info)["pool_blocks"] = opts.pool_blocks;
  (*info)["pool_huge_pages"] = pair->huge_pages();
  for (int i = 0; i < kForwardPasses; ++i) {
    BATON_ASSIGN_OR_RETURN(double ms, pair->ForwardPassMs());
    if (i > 0) (*series)["forward_pass_ms"].push_back(ms);  // the first one warms up
  }
  int before_barrier = 0;  // trials whose promotion did not wait for the old primary's barrier
  for (int i = 0; i < flags.trials; ++i) {
    BATON_ASSIGN_OR_RETURN(FailoverSample s, pair->Trial());
    std::fprintf(stderr,
                 "  baton %d: ready %.2f ms (%d probes), first token %.2f ms; detect %.2f fence "
                 "%.2f promote %.2f controller ready %.2f teardown %.2f ms (promoted %s the "
                 "barrier); before kill %.2f ms, next %.2f ms\n",
                 i + 1, s.ready_ms, s.probes, s.first_token_ms, s.detect_ms.value_or(-1),
                 s.fence_ms, s.promote_ms, s.controller_ready_ms, s.teardown_ms,
                 s.before_barrier ? "before" : "after", s.before_kill_ms, s.next_request_ms);
    (*series)["ready_ms"].push_back(s.ready_ms);
    (*series)["first_token_ms"].push_back(s.first_token_ms);
    (*series)["first_token_after_ready_ms"].push_back(s.first_token_ms - s.ready_ms);
    if (s.detect_ms) (*series)["detect_ms"].push_back(*s.detect_ms);
    (*series)["fence_ms"].push_back(s.fence_ms);
    (*series)["promote_ms"].push_back(s.promote_ms);
    (*series)["controller_ready_ms"].push_back(s.controller_ready_ms);
    (*series)["teardown_ms"].push_back(s.teardown_ms);
    before_barrier += s.before_barrier ? 1 : 0;
    (*series)["forward_pass_ms"].push_back(s.next_request_ms);
    (*series)["forward_pass_ms"].push_back(s.before_kill_ms);
    (*series)["forward_pass_before_kill_ms"].push_back(s.before_kill_ms);
  }
  (*info)["promoted_before_barrier"] = before_barrier;
  const int code = pair->Stop();
  if (code != 0) std::fprintf(stderr, "  baton-controller exited with %d\n", code);
  return OkStatus();
}

Status RunCold(const Flags& flags, const ModelInfo& model, const PairOptions& opts, int kv_tokens,
               Series* series, double* worst_resident) {
  for (int i = 0; i < flags.trials; ++i) {
    for (bool evict : {false, true}) {
      BATON_ASSIGN_OR_RETURN(ColdSample s, ColdTrial(model, opts, evict, kv_tokens, i + 1));
      const char* kind = evict ? "evicted" : "warm";
      std::fprintf(stderr, "  cold %s %d: listening %.1f ms, first token %.1f ms (%.1f%% cached)\n",
                   kind, i + 1, s.listening_ms, s.first_token_ms, 100 * s.resident_before);
      (*series)[std::string("cold_") + kind + "_first_token_ms"].push_back(s.first_token_ms);
      (*series)[std::string("cold_") + kind + "_listening_ms"].push_back(s.listening_ms);
      if (evict) *worst_resident = std::max(*worst_resident, s.resident_before);
    }
  }
  return OkStatus();
}

Result<json> RunModel(const Flags& flags, const std::string& name, const std::string& dir,
                      const std::string& work) {
  if (flags.generate) {
    BATON_ASSIGN_OR_RETURN(ModelSummary written, EnsureFailoverModel(name, dir));
    std::fprintf(stderr, "%s %s model in %s (%.1f s)\n", written.reused ? "reused" : "wrote",
                 name.c_str(), dir.c_str(), written.seconds);
  }
  BATON_ASSIGN_OR_RETURN(ModelInfo model, DescribeModel(dir));
  std::fprintf(stderr, "%s model %s: %zu files, %llu bytes, %llu KV bytes a token\n", name.c_str(),
               dir.c_str(), model.files.size(), static_cast<unsigned long long>(model.file_bytes),
               static_cast<unsigned long long>(model.kv_bytes_per_token));
  PairOptions opts{flags.bin,           work + "/" + name,   flags.threads, flags.pool_blocks,
                   flags.prompt_tokens, flags.epoch_reserve, flags.engine};
  std::filesystem::create_directories(opts.work_dir);
  json info = {{"model_dir", dir},
               {"model_bytes", model.file_bytes},
               {"trials", flags.trials},
               {"engine_threads", flags.threads},
               {"prompt_tokens", flags.prompt_tokens},
               {"epoch_reserve", flags.epoch_reserve},
               {"engine", EngineProgram(opts)}};
  Series series;
  int kv_tokens = 0;
  BATON_RETURN_IF_ERROR(RunBaton(flags, model, opts, &kv_tokens, &series, &info));
  double worst_resident = 0;
  BATON_RETURN_IF_ERROR(RunCold(flags, model, opts, kv_tokens, &series, &worst_resident));
  info["evicted_max_resident_fraction"] = worst_resident;
  Summarize(series, &info);
  return info;
}

json Ratio(const json& a, const char* ka, const json& b, const char* kb) {
  if (!a.contains(ka) || !b.contains(kb) || b[kb].get<double>() <= 0) return nullptr;
  return a[ka].get<double>() / b[kb].get<double>();
}

json Acceptance(const json& r) {
  json a = json::object();
  bool all = true;
  auto check = [&](const std::string& name, bool ok) {
    a[name] = ok;
    all = all && ok;
  };
  for (const char* m : {"small", "large"}) {
    const json& x = r[m];
    check(std::string(m) + "_ready_p50", x["ready_ms_p50"].get<double>() <= kReadyP50Ms);
    check(std::string(m) + "_ready_p99", x["ready_ms_p99"].get<double>() <= kReadyP99Ms);
    check(std::string(m) + "_first_token_within_one_forward_pass",
          x["first_token_after_ready_ms_p50"].get<double>() <= x["forward_pass_ms_p99"]);
  }
  check("baton_large_over_small",
        r["baton_large_over_small"].is_number() &&
            r["baton_large_over_small"].get<double>() <= kLargeOverSmallMax);
  check("cold_over_baton_large", r["cold_over_baton_large"].is_number() &&
                                     r["cold_over_baton_large"].get<double>() >= kColdOverBatonMin);
  a["all"] = all;
  return a;
}

int Run(const Flags& flags) {
  Result<perf::WorkDir> work = perf::WorkDir::Make("baton-perf-failover", flags.out);
  if (!work.ok()) return perf::FailRun("baton-perf-failover", work.status());
  json result = json::object();
  for (const auto& [name, dir] : {std::pair{"small", flags.small}, {"large", flags.large}}) {
    Result<json> r = RunModel(flags, name, dir, work->path());
    if (!r.ok()) {
      return perf::FailRun(
          "baton-perf-failover",
          Status(r.status().code(), std::string(name) + " model: " + r.status().message()), *work);
    }
    result[name] = *r;
  }
  result["cold_over_baton_large"] =
      Ratio(result["large"], "cold_warm_first_token_ms_p50", result["large"], "first_token_ms_p50");
  result["baton_large_over_small"] =
      Ratio(result["large"], "ready_ms_p50", result["small"], "ready_ms_p50");
  result["cold_over_baton_large_ready"] =
      Ratio(result["large"], "cold_warm_listening_ms_p50", result["large"], "ready_ms_p50");
  result["p99"] = "nearest rank; with fewer than 100 trials it is the maximum";
  result["meets_targets"] = Acceptance(result);
  for (const char* m : {"small", "large"}) {
    const json& x = result[m];
    std::printf(
        "%-5s baton ready %.2f / %.2f ms, teardown %.2f / %.2f ms, first token %.2f / %.2f ms "
        "(p50 / p99); forward pass %.2f ms; cold first token warm %.1f ms, evicted %.1f ms "
        "(p50)\n",
        m, x.value("ready_ms_p50", 0.0), x.value("ready_ms_p99", 0.0),
        x.value("teardown_ms_p50", 0.0), x.value("teardown_ms_p99", 0.0),
        x.value("first_token_ms_p50", 0.0), x.value("first_token_ms_p99", 0.0),
        x.value("forward_pass_ms_p50", 0.0), x.value("cold_warm_first_token_ms_p50", 0.0),
        x.value("cold_evicted_first_token_ms_p50", 0.0));
  }
  if (Status s = perf::EmitResult(result, flags.out, "failover.json"); !s.ok()) {
    return perf::FailRun("baton-perf-failover", s, *work);
  }
  return 0;
}

}  // namespace
}  // namespace baton

int main(int argc, char** argv) {
  return baton::perf::RunPerfDriver<baton::Flags>(argc, argv, "baton-perf-failover", baton::kUsage,
                                                  baton::ParseFlags, baton::Run);
}
