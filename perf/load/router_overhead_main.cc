// baton-perf-router-overhead: what baton-router adds to a request's latency. The same load
// goes straight to a reference engine and through a router in front of it, side by side.
//
//   baton-perf-router-overhead [--requests N] [--clients C] [--rounds R] [--warmup W]
//                              [--bin DIR] [--model-dir DIR] [--router-threads K] [--out DIR]
//                              [--engine-key on|off]
//
// Stack: a standalone baton-refengine on baton-mkmodel's tiny preset (written into
// --model-dir, or a scratch directory, and reused while it matches) and a baton-router with
// `--backend` set to that engine. Load: N non-streaming completions a side (default 2000),
// max_tokens 1, temperature 0.8, seeds 0..N-1 over eight fixed prompts; C concurrent clients
// (default 4), each with one keep-alive connection to the engine and one to the router.
// The requests are cut into R rounds (default 10); each round runs its slice against both
// sides, one after the other, the order alternating between rounds, so that drift (other
// load on the machine, the engine's caches) hits both sides alike. W requests a side warm
// up first and are not counted. Latency is from the first byte sent to the last byte read.
//
// The last line of stdout is one JSON object: direct_* and router_* percentiles
// (nearest rank), added_p50_ms = router_p50_ms - direct_p50_ms, added_p99_ms likewise,
// requests (a side), errors (non-200 or failed calls, either side), mismatched (a request
// whose router answer differs from its direct answer in text or token ids).
// With C > 1 the same comparison is made again with one client (`sequential`): with several
// closed-loop clients the engine's single compute thread is the bottleneck and queueing
// behind it hides most of a hop's cost, which one client at a time shows. meets_target
// checks added_p50_ms (both) at most 0.3 ms. With --engine-key on, the engine is given an
// engine key (BATON_ENGINE_KEYS), the router sends it from its --engine-key-file, and the
// direct clients send it too: what the key's check and header cost on each side. --out DIR keeps
// the engine's and router's logs, the per-request latencies (latencies-C-clients.csv) and the JSON
// (router_overhead.json).
#include <unistd.h>

#include <atomic>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "perf/driver_main.h"
#include "perf/load/load_client.h"
#include "perf/load/load_procs.h"
#include "perf/pair/failover_procs.h"

namespace baton {
namespace {

using namespace ::baton::perf;  // NOLINT: the driver's vocabulary
using nlohmann::json;

constexpr char kUsage[] =
    "usage: baton-perf-router-overhead [--requests N] [--clients C] [--rounds R] [--warmup W]\n"
    "                                  [--bin DIR] [--model-dir DIR] [--router-threads K]\n"
    "                                  [--out DIR] [--engine-key on|off]\n";
constexpr char kServedName[] = "tiny";
constexpr double kTargetAddedP50Ms = 0.3;
constexpr const char* kPrompts[] = {
    "The router forwards this request.",        "Baton keeps the service answering.",
    "A standby waits with its weights mapped.", "Tokens are replayed on the new primary.",
    "Every chunk carries its token ids.",       "The controller owns the pool.",
    "Latency is measured from the client.",     "Keep-alive connections stay open."};

struct Flags {
  int requests = 2000, clients = 4, rounds = 10, warmup = 100, router_threads = 0;
  bool engine_key = false;
  std::string bin, model_dir, out;
};

std::string ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (i + 1 >= argc) return "unknown or incomplete argument: " + std::string(arg);
    const std::string_view v = argv[++i];
    if (arg == "--requests") {
      if (!perf::ParseFlagNumber<int>(v, 1, 10'000'000, &f->requests))
        return "--requests: not a number >= 1";
    } else if (arg == "--clients") {
      if (!perf::ParseFlagNumber<int>(v, 1, 256, &f->clients))
        return "--clients: not a number in [1, 256]";
    } else if (arg == "--rounds") {
      if (!perf::ParseFlagNumber<int>(v, 1, 10000, &f->rounds))
        return "--rounds: not a number in [1, 10000]";
    } else if (arg == "--warmup") {
      if (!perf::ParseFlagNumber<int>(v, 0, 1'000'000, &f->warmup))
        return "--warmup: not a number >= 0";
    } else if (arg == "--router-threads") {
      if (!perf::ParseFlagNumber<int>(v, 1, 256, &f->router_threads))
        return "--router-threads: not in [1, 256]";
    } else if (arg == "--bin") {
      f->bin = v;
    } else if (arg == "--model-dir") {
      f->model_dir = v;
    } else if (arg == "--out") {
      f->out = v;
    } else if (arg == "--engine-key") {
      if (v != "on" && v != "off") return "--engine-key: on or off";
      f->engine_key = v == "on";
    } else {
      return "unknown argument: " + std::string(arg);
    }
  }
  if (f->rounds > f->requests) f->rounds = f->requests;
  return "";
}

std::string RequestBody(int i) {
  return json{{"model", kServedName},
              {"prompt", kPrompts[i % 8]},
              {"max_tokens", 1},
              {"temperature", 0.8},
              {"seed", i}}
      .dump();
}

// The key of --engine-key on: a fixed one (a measurement, not a secret).
constexpr char kEngineKey[] = "router-overhead-engine-key-0123456789";

// --engine-key on: the key file the router reads, in `work`; "" when off.
Result<std::string> WriteEngineKeyFile(const Flags& flags, const std::string& work) {
  if (!flags.engine_key) return std::string();
  const std::string path = work + "/engine.key";
  std::ofstream(path, std::ios::trunc) << kEngineKey << "\n";
  std::error_code ec;
  std::filesystem::permissions(
      path, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write, ec);
  if (ec) return Internal("chmod " + path + ": " + ec.message());
  return path;
}

// One side of the comparison: a keep-alive client per client thread, a sample per request.
struct Side {
  std::string name;
  std::vector<LoadClient> clients;
  std::vector<double> latency_ms;  // by request index; < 0 when the request failed
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::string> text;
  std::atomic<int> errors{0};
  std::string first_error;
};

// Sends requests [begin, end) to `side` from `clients` threads; records each one.
void RunSlice(Side* side, const std::vector<std::string>& bodies, int begin, int end, bool record) {
  std::atomic<int> next{begin};
  std::vector<std::thread> threads;
  for (LoadClient& client : side->clients) {
    threads.emplace_back([&, c = &client] {
      for (int i = next++; i < end; i = next++) {
        const auto start = RealClock::Get().Now();
        LoadReply r = c->Post("/v1/completions", bodies[i]);
        const double ms =
            std::chrono::duration<double, std::milli>(RealClock::Get().Now() - start).count();
        if (!record) continue;
        if (r.status != 200) {
          if (side->errors++ == 0) {
            side->first_error =
                r.status != 0 ? "HTTP " + std::to_string(r.status) + ": " + r.body.substr(0, 200)
                              : r.error;
          }
          continue;
        }
        CompletionOutput out = ParseCompletion(r.body, /*stream=*/false);
        side->latency_ms[i] = ms;
        side->ids[i] = std::move(out.token_ids);
        side->text[i] = std::move(out.text);
      }
    });
  }
  for (std::thread& t : threads) t.join();
}

json Summary(const Side& side, const std::string& prefix, std::vector<double>* kept) {
  for (double ms : side.latency_ms) {
    if (ms >= 0) kept->push_back(ms);
  }
  double sum = 0;
  for (double ms : *kept) sum += ms;
  return {{prefix + "_p50_ms", Percentile(*kept, 50)},
          {prefix + "_p90_ms", Percentile(*kept, 90)},
          {prefix + "_p99_ms", Percentile(*kept, 99)},
          {prefix + "_mean_ms", kept->empty() ? 0.0 : sum / static_cast<double>(kept->size())}};
}

// The whole request list at `clients` concurrency against both sides, in alternating
// rounds; the summary of both and of what the router adds.
Result<json> CompareSides(const Flags& flags, const std::vector<std::string>& bodies, int clients,
                          const ServingProcess& engine, const ServingProcess& router) {
  Side direct, routed;
  direct.name = "direct";
  routed.name = "router";
  for (Side* side : {&direct, &routed}) {
    const std::string& address = side == &direct ? engine.address : router.address;
    for (int c = 0; c < clients; ++c) {
      side->clients.emplace_back(address);
      if (side == &direct && flags.engine_key) {
        side->clients.back().SetAuthorization(std::string("Bearer ") + kEngineKey);
      }
    }
    side->latency_ms.assign(bodies.size(), -1);
    side->ids.resize(bodies.size());
    side->text.resize(bodies.size());
    RunSlice(side, bodies, 0, std::min<int>(flags.warmup, flags.requests), /*record=*/false);
  }
  for (int r = 0; r < flags.rounds; ++r) {
    const int begin = static_cast<int>(int64_t{flags.requests} * r / flags.rounds);
    const int end = static_cast<int>(int64_t{flags.requests} * (r + 1) / flags.rounds);
    Side* first = r % 2 == 0 ? &direct : &routed;
    Side* second = r % 2 == 0 ? &routed : &direct;
    RunSlice(first, bodies, begin, end, true);
    RunSlice(second, bodies, begin, end, true);
    std::vector<double> d(direct.latency_ms.begin() + begin, direct.latency_ms.begin() + end);
    std::vector<double> g(routed.latency_ms.begin() + begin, routed.latency_ms.begin() + end);
    std::fprintf(stderr,
                 "  %d client(s), round %d (%s first): direct p50 %.3f ms, router p50 %.3f ms\n",
                 clients, r + 1, first->name.c_str(), Percentile(d, 50), Percentile(g, 50));
  }
  int mismatched = 0;
  for (size_t i = 0; i < bodies.size(); ++i) {
    if (direct.latency_ms[i] >= 0 && routed.latency_ms[i] >= 0 &&
        (direct.ids[i] != routed.ids[i] || direct.text[i] != routed.text[i])) {
      ++mismatched;
    }
  }
  if (!flags.out.empty()) {
    std::ofstream csv(flags.out + "/latencies-" + std::to_string(clients) + "-clients.csv");
    csv << "request,direct_ms,router_ms\n";
    for (size_t i = 0; i < bodies.size(); ++i) {
      csv << i << "," << direct.latency_ms[i] << "," << routed.latency_ms[i] << "\n";
    }
  }
  std::vector<double> d, g;
  json result = Summary(direct, "direct", &d);
  result.update(Summary(routed, "router", &g));
  auto ms = [&](const char* key) { return result[key].get<double>(); };
  result["added_p50_ms"] = ms("router_p50_ms") - ms("direct_p50_ms");
  result["added_p99_ms"] = ms("router_p99_ms") - ms("direct_p99_ms");
  result["added_mean_ms"] = ms("router_mean_ms") - ms("direct_mean_ms");
  result["requests"] = flags.requests;
  result["counted"] = {{"direct", d.size()}, {"router", g.size()}};
  result["clients"] = clients;
  result["errors"] = direct.errors.load() + routed.errors.load();
  if (!direct.first_error.empty()) result["first_direct_error"] = direct.first_error;
  if (!routed.first_error.empty()) result["first_router_error"] = routed.first_error;
  result["mismatched"] = mismatched;
  return result;
}

Result<json> Measure(const Flags& flags, const std::string& work) {
  std::error_code ec;  // this run's logs start empty (the processes append to them)
  for (const char* old : {"engine.log", "router.log"})
    std::filesystem::remove(work + "/" + old, ec);
  const std::string model_dir = flags.model_dir.empty() ? work + "/model" : flags.model_dir;
  BATON_ASSIGN_OR_RETURN(ModelSummary model, EnsureTinyModel(model_dir));
  std::fprintf(stderr, "%s tiny model in %s\n", model.reused ? "reused" : "wrote",
               model_dir.c_str());
  BATON_ASSIGN_OR_RETURN(const std::string key_file, WriteEngineKeyFile(flags, work));
  if (flags.engine_key) ::setenv("BATON_ENGINE_KEYS", kEngineKey, 1);  // the engine inherits it
  Result<ServingProcess> started =
      StartStandaloneEngine(flags.bin, model_dir, kServedName, work, {});
  ::unsetenv("BATON_ENGINE_KEYS");
  BATON_ASSIGN_OR_RETURN(ServingProcess engine, std::move(started));
  std::vector<std::string> router_args = {"--backend", engine.address};
  if (!key_file.empty()) router_args.insert(router_args.end(), {"--engine-key-file", key_file});
  if (flags.router_threads > 0) {
    router_args.insert(router_args.end(), {"--threads", std::to_string(flags.router_threads)});
  }
  BATON_ASSIGN_OR_RETURN(ServingProcess router,
                         StartRouterProcess(flags.bin, router_args, work + "/router.log"));
  std::fprintf(stderr, "engine %s, router %s; %d requests a side, %d clients, %d rounds\n",
               engine.address.c_str(), router.address.c_str(), flags.requests, flags.clients,
               flags.rounds);
  std::vector<std::string> bodies;
  for (int i = 0; i < flags.requests; ++i) bodies.push_back(RequestBody(i));
  BATON_ASSIGN_OR_RETURN(json result, CompareSides(flags, bodies, flags.clients, engine, router));
  // With several closed-loop clients the engine's one compute thread is the bottleneck and a
  // request's latency is mostly its wait behind the others', which hides what a hop adds; one
  // client at a time shows the router's own cost.
  json sequential = result;
  if (flags.clients > 1) {
    BATON_ASSIGN_OR_RETURN(sequential, CompareSides(flags, bodies, 1, engine, router));
    result["sequential"] = sequential;
  }
  if (!router.process.Running()) return Internal("baton-router exited; see " + router.log);
  if (!engine.process.Running()) return Internal("baton-refengine exited; see " + engine.log);
  result["rounds"] = flags.rounds;
  result["model"] = "tiny";
  result["max_tokens"] = 1;
  result["engine_key"] = flags.engine_key;
  result["p99"] = "nearest rank";
  result["meets_target"] = {
      {"added_p50_ms_at_most_0.3", result["added_p50_ms"].get<double>() <= kTargetAddedP50Ms},
      {"sequential_added_p50_ms_at_most_0.3",
       sequential["added_p50_ms"].get<double>() <= kTargetAddedP50Ms}};
  router.process.Stop(std::chrono::seconds(5));
  engine.process.Stop(std::chrono::seconds(5));
  return result;
}

int Run(const Flags& flags) {
  Result<perf::WorkDir> work = perf::WorkDir::Make("baton-perf-router-overhead", flags.out);
  if (!work.ok()) return perf::FailRun("baton-perf-router-overhead", work.status());
  Result<json> result = Measure(flags, work->path());
  if (!result.ok()) return perf::FailRun("baton-perf-router-overhead", result.status(), *work);
  std::printf("direct p50 %.3f ms p99 %.3f ms; router p50 %.3f ms p99 %.3f ms; added p50 %.3f ms\n",
              (*result)["direct_p50_ms"].get<double>(), (*result)["direct_p99_ms"].get<double>(),
              (*result)["router_p50_ms"].get<double>(), (*result)["router_p99_ms"].get<double>(),
              (*result)["added_p50_ms"].get<double>());
  if (Status s = perf::EmitResult(*result, flags.out, "router_overhead.json"); !s.ok()) {
    return perf::FailRun("baton-perf-router-overhead", s, *work);
  }
  return 0;
}

}  // namespace
}  // namespace baton

int main(int argc, char** argv) {
  return baton::perf::RunPerfDriver<baton::Flags>(argc, argv, "baton-perf-router-overhead",
                                                  baton::kUsage, baton::ParseFlags, baton::Run);
}
