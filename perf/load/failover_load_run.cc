#include "perf/load/failover_load_run.h"

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <thread>

#include "base/clock.h"
#include "perf/load/load_client.h"

namespace baton::perf {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

constexpr int kReferenceClients = 16;
constexpr size_t kRepeatChecks = 20;
constexpr auto kClientTimeout = std::chrono::seconds(60);

double SecondsSince(TimePoint t0) {
  return std::chrono::duration<double>(RealClock::Get().Now() - t0).count();
}

TimePoint At(TimePoint t0, double seconds) {
  return t0 + std::chrono::duration_cast<Duration>(std::chrono::duration<double>(seconds));
}

// One request of the load, recorded in its ledger entry.
void Send(LoadClient* client, const LoadRequest& r, TimePoint t0, LedgerEntry* e,
          std::atomic<bool>* body_started = nullptr) {
  e->invoked = true;
  e->sent_s = SecondsSince(t0);
  LoadReply reply = client->Post(r.path, r.body, body_started);
  e->end_s = SecondsSince(t0);
  Classify(reply, r.stream, e);
}

// The serving primary's pid and id, read from `batonctl status` (retrying for up to 5 s).
Result<PrimaryInfo> ServingPrimary(const ControllerPair& pair) {
  Status last = Unavailable("no serving primary");
  const auto deadline = RealClock::Get().Now() + std::chrono::seconds(5);
  while (RealClock::Get().Now() < deadline) {
    Result<json> status = pair.Ctl({"status"});
    if (status.ok() && PrimaryOf(*status).pid > 0) return PrimaryOf(*status);
    last = status.ok() ? Unavailable("no serving primary") : status.status();
    std::this_thread::sleep_for(milliseconds(50));
  }
  return last;
}

bool IsUpgrade(const Fault& f) { return f.kind == "upgrade" || f.kind == "bad_upgrade"; }

// `batonctl upgrade` to the pair's own engine command with another version label (a good
// build) or with every completion answered 500 (a broken one): steps 10, 50, 100 % of 2 s.
Status StartUpgrade(const ControllerPair& pair, const Fault& fault) {
  BATON_ASSIGN_OR_RETURN(json status, pair.Ctl({"status"}));
  std::vector<std::string> args = {"upgrade", "--steps",        "10,50,100", "--step-ms",
                                   "2000",    "--min-requests", "20",        "--"};
  for (const json& a : status["upgrade"]["active_command"]) args.push_back(a.get<std::string>());
  if (fault.kind == "upgrade") {
    args.insert(args.end(), {"--engine-version", "perf-upgrade"});
  } else {
    args.insert(args.end(), {"--fail-percent", "100"});
  }
  return pair.Ctl(args).status();
}

// Injects `fault` at its time, in the middle of its probe's stream.
void InjectFault(const ControllerPair& pair, const std::string& router,
                 const std::vector<LoadRequest>& requests, TimePoint t0, Fault* fault,
                 std::vector<LedgerEntry>* entries, std::vector<std::thread>* probes) {
  std::this_thread::sleep_until(At(t0, fault->at_s - 0.2));  // batonctl takes some ms
  fault->at_s = -1;
  Result<PrimaryInfo> primary = ServingPrimary(pair);
  if (!primary.ok()) {
    fault->error = primary.status().ToString();
    std::fprintf(stderr, "  %s not sent: %s\n", fault->kind.c_str(), fault->error.c_str());
    return;
  }
  std::this_thread::sleep_until(At(t0, requests[fault->probe].at_s));
  auto started = std::make_shared<std::atomic<bool>>(false);
  auto done = std::make_shared<std::atomic<bool>>(false);
  probes->emplace_back([&requests, &router, entries, t0, started, done, i = fault->probe] {
    LoadClient client(router, kClientTimeout);
    Send(&client, requests[i], t0, &(*entries)[i], started.get());
    *done = true;
  });
  // Spin rather than sleep: a sleep's wake-up can come later than the whole stream's end.
  const auto deadline = RealClock::Get().Now() + std::chrono::seconds(5);
  while (!*started && !*done && RealClock::Get().Now() < deadline) std::this_thread::yield();
  fault->stream_in_flight = *started && !*done;
  const double at = SecondsSince(t0);
  if (IsUpgrade(*fault)) {
    if (Status s = StartUpgrade(pair, *fault); !s.ok()) {
      fault->error = s.ToString();
      return;
    }
    fault->at_s = at;
    std::fprintf(stderr, "  %.3f s: batonctl upgrade (%s)\n", at, fault->kind.c_str());
    return;
  }
  if (::kill(primary->pid, fault->kind == "kill" ? SIGKILL : SIGSTOP) != 0) {
    fault->error = ErrnoStatus("kill " + std::to_string(primary->pid), errno).ToString();
    return;
  }
  fault->at_s = at;
  fault->pid = primary->pid;
  fault->engine_id = primary->engine_id;
  std::fprintf(stderr, "  %.3f s: %s to engine %llu (pid %d), %s\n", at,
               fault->kind == "kill" ? "SIGKILL" : "SIGSTOP",
               static_cast<unsigned long long>(primary->engine_id), primary->pid,
               fault->stream_in_flight ? "its probe stream midway" : "its probe stream NOT midway");
}

}  // namespace

namespace {

// Candidate seeds of one kind of probe, the longest-running first.
Result<std::vector<uint64_t>> LongestSeeds(LoadClient* client, const std::string& model,
                                           bool chat) {
  constexpr uint64_t kFirstSeed = 9000;
  constexpr int kCandidates = 32;
  std::vector<std::pair<size_t, uint64_t>> lengths;  // (tokens, seed)
  for (int k = 0; k < kCandidates; ++k) {
    const LoadRequest probe = MakeProbeRequest(0, 0, kFirstSeed + k, model, chat);
    LedgerEntry e;
    Classify(client->Post(probe.path, probe.body), /*stream=*/true, &e);
    if (e.outcome != Outcome::kOk) return Internal("probe seed run failed: " + e.reason);
    lengths.emplace_back(e.output.token_ids.size(), kFirstSeed + k);
  }
  std::stable_sort(lengths.begin(), lengths.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<uint64_t> seeds;
  for (const auto& [tokens, seed] : lengths) seeds.push_back(seed);
  return seeds;
}

}  // namespace

Result<std::vector<uint64_t>> ProbeSeeds(const std::string& router, const std::string& model,
                                         int count) {
  LoadClient client(router, kClientTimeout);
  BATON_ASSIGN_OR_RETURN(std::vector<uint64_t> text, LongestSeeds(&client, model, false));
  std::vector<uint64_t> chat;
  if (count > 1) {
    BATON_ASSIGN_OR_RETURN(chat, LongestSeeds(&client, model, true));
  }
  std::vector<uint64_t> seeds;
  for (int i = 0; i < count; ++i) {
    const std::vector<uint64_t>& kind = ProbeIsChat(i) ? chat : text;
    seeds.push_back(kind[static_cast<size_t>(i / 2) % kind.size()]);
  }
  return seeds;
}

Result<std::vector<Reference>> ReferenceRun(const std::string& router,
                                            const std::vector<LoadRequest>& requests,
                                            int* repeat_mismatches) {
  std::vector<LedgerEntry> entries(requests.size());
  std::atomic<int> next{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < kReferenceClients; ++c) {
    threads.emplace_back([&] {
      LoadClient client(router, kClientTimeout);
      for (int i = next++; i < static_cast<int>(requests.size()); i = next++) {
        Classify(client.Post(requests[i].path, requests[i].body), requests[i].stream, &entries[i]);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  std::vector<Reference> refs;
  for (size_t i = 0; i < entries.size(); ++i) {
    if (entries[i].outcome != Outcome::kOk) {
      return Internal("reference run: request " + std::to_string(i) +
                      " failed: " + entries[i].reason);
    }
    refs.push_back({entries[i].output.text, entries[i].output.token_ids});
  }
  // Sampling is a pure function of (seed, position, logits): the same request again must
  // give the same output, or no comparison means anything.
  LoadClient client(router, kClientTimeout);
  *repeat_mismatches = 0;
  for (size_t i = 0; i < std::min(kRepeatChecks, requests.size()); ++i) {
    LedgerEntry again;
    Classify(client.Post(requests[i].path, requests[i].body), requests[i].stream, &again);
    if (again.outcome != Outcome::kOk || again.output.token_ids != refs[i].token_ids ||
        again.output.text != refs[i].text) {
      ++*repeat_mismatches;
    }
  }
  return refs;
}

void RunLoad(const std::string& router, const std::vector<LoadRequest>& requests, int load_count,
             int clients, const ControllerPair& pair, std::vector<Fault>* faults,
             std::vector<LedgerEntry>* entries) {
  const TimePoint t0 = RealClock::Get().Now() + milliseconds(500);
  std::atomic<int> next{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&] {
      LoadClient client(router, kClientTimeout);
      for (int i = next++; i < load_count; i = next++) {
        std::this_thread::sleep_until(At(t0, requests[i].at_s));
        Send(&client, requests[i], t0, &(*entries)[i]);
      }
    });
  }
  std::vector<std::thread> probes;
  for (Fault& f : *faults) InjectFault(pair, router, requests, t0, &f, entries, &probes);
  for (std::thread& t : probes) t.join();
  for (std::thread& t : threads) t.join();
}

}  // namespace baton::perf
