#include "perf/kv/failover_long_run.h"

#include <signal.h>
#include <sys/stat.h>

#include <atomic>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "base/clock.h"
#include "perf/load/load_procs.h"

namespace baton::perf {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::seconds;

struct Stream {
  LoadReply reply;
  CompletionOutput out;
  std::vector<TimePoint> token_at;  // the arrival of each token id
};

std::string Body(const LongRequest& r, const std::string& model) {
  return json{{"model", model}, {"prompt", r.prompt}, {"max_tokens", r.max_tokens},
              {"seed", r.seed}, {"temperature", 0.9}, {"stream", true}}
      .dump();
}

// Folds the complete events of `pending` into the arrival times, counting into `tokens`.
void TakeEvents(std::string* pending, TimePoint now, Stream* s, std::atomic<int>* tokens) {
  size_t end;
  while ((end = pending->find("\n\n")) != std::string::npos) {
    const std::string event = pending->substr(0, end);
    pending->erase(0, end + 2);
    if (event.rfind("data: {", 0) != 0) continue;
    const json j = json::parse(event.substr(6), nullptr, false);
    if (!j.is_object() || !j.contains("choices") || !j["choices"].is_array() ||
        j["choices"].empty() || !j["choices"][0].contains("token_ids")) {
      continue;
    }
    const size_t n = j["choices"][0]["token_ids"].size();
    s->token_at.insert(s->token_at.end(), n, now);
    tokens->fetch_add(static_cast<int>(n));
  }
}

Stream RunStream(const std::string& router, const std::string& model, const LongRequest& r,
                 std::atomic<int>* tokens) {
  LoadClient client(router, seconds(600));
  Stream s;
  std::string pending;
  s.reply = client.Post("/v1/completions", Body(r, model), nullptr, [&](std::string_view chunk) {
    pending.append(chunk);
    TakeEvents(&pending, RealClock::Get().Now(), &s, tokens);
  });
  s.out = ParseCompletion(s.reply.body, /*stream=*/true);
  return s;
}

// Every request streamed at once; `cut` runs once each has `cut_after` tokens (never when
// null). Fails when a stream ends before that.
Result<std::vector<Stream>> StreamAll(const std::string& router, const std::string& model,
                                      const std::vector<LongRequest>& requests, int cut_after,
                                      const std::function<void()>& cut) {
  const size_t n = requests.size();
  std::vector<Stream> streams(n);
  auto tokens = std::make_unique<std::atomic<int>[]>(n);
  auto finished = std::make_unique<std::atomic<bool>[]>(n);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < n; ++i) {
    tokens[i] = 0;
    finished[i] = false;
    threads.emplace_back([&, i] {
      streams[i] = RunStream(router, model, requests[i], &tokens[i]);
      finished[i] = true;
    });
  }
  Status early = OkStatus();
  if (cut) {
    for (bool ready = false; !ready;) {
      ready = true;
      for (size_t i = 0; i < n; ++i) {
        if (tokens[i].load() < cut_after) ready = false;
        if (finished[i].load() && tokens[i].load() < cut_after) {
          early = FailedPrecondition("stream " + std::to_string(i) + " ended after " +
                                     std::to_string(tokens[i].load()) + " tokens, before the cut");
        }
      }
      if (!early.ok()) break;
      if (!ready) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    if (early.ok()) cut();
  }
  for (std::thread& t : threads) t.join();
  BATON_RETURN_IF_ERROR(early);
  for (size_t i = 0; i < n; ++i) {
    const Stream& s = streams[i];
    if (s.reply.status != 200 || !s.out.error.empty() || !s.out.done_marker) {
      return Unavailable("stream " + std::to_string(i) + ": status " +
                         std::to_string(s.reply.status) + " " + s.reply.error + " " + s.out.error);
    }
  }
  return streams;
}

double Counter(const std::string& address, const std::string& series) {
  LoadClient client(address, seconds(10));
  const LoadReply r = client.Get("/metrics");
  size_t at = r.body.find("\n" + series + " ");
  if (at == std::string::npos) return 0;
  return std::atof(r.body.c_str() + at + series.size() + 2);
}

Status KillTrial(ControllerPair& pair, const ServingProcess& router, const LongModeConfig& c,
                 const std::vector<LongRequest>& requests,
                 const std::vector<CompletionOutput>& reference, LongModeResult* result) {
  BATON_ASSIGN_OR_RETURN(json ready, pair.WaitReady(milliseconds(300000)));
  const PrimaryInfo primary = PrimaryOf(ready);
  TimePoint killed_at{};
  BATON_ASSIGN_OR_RETURN(std::vector<Stream> streams,
                         StreamAll(router.address, c.served_name, requests, c.cut_after, [&] {
                           killed_at = RealClock::Get().Now();
                           ::kill(primary.pid, SIGKILL);
                         }));
  const TimePoint after =
      killed_at + std::chrono::microseconds(static_cast<int64_t>(kInFlightMs * 1000));
  for (size_t i = 0; i < streams.size(); ++i) {
    const Stream& s = streams[i];
    auto next =
        std::find_if(s.token_at.begin(), s.token_at.end(), [&](TimePoint t) { return t > after; });
    if (next == s.token_at.end()) {
      return FailedPrecondition("stream " + std::to_string(i) + " had no token after the kill");
    }
    result->next_token_ms.push_back(MillisBetween(killed_at, *next));
    if (s.out.token_ids != reference[i].token_ids || s.out.text != reference[i].text) {
      ++result->mismatched;
    }
  }
  result->in_flight += static_cast<int>(requests.size());
  BATON_ASSIGN_OR_RETURN(json again, pair.WaitReady(milliseconds(300000)));
  if (c.kv_handoff) {
    result->adopted += static_cast<int>(
        Counter(PrimaryOf(again).address, "baton_engine_kv_adopted_sequences_total"));
  }
  return OkStatus();
}

}  // namespace

std::vector<LongRequest> LongRequests(int count, int context, int max_tokens) {
  std::vector<LongRequest> out;
  for (int i = 0; i < count; ++i) {
    LongRequest r;
    r.max_tokens = max_tokens;
    r.seed = 1000 + static_cast<uint64_t>(i);
    for (int j = 0; j < context; ++j) r.prompt.push_back(32 + (i * 31 + j * 7 + j / 5) % 95);
    out.push_back(std::move(r));
  }
  return out;
}

// The undisturbed outputs, each stream with a seed whose answer runs to max_tokens (one that
// ends on its own could end before the kill and leave nothing to continue).
Status Reference(const ServingProcess& router, const std::string& model,
                 std::vector<LongRequest>* requests, std::vector<CompletionOutput>* reference) {
  constexpr int kRounds = 8;
  std::vector<size_t> todo(requests->size());
  for (size_t i = 0; i < todo.size(); ++i) todo[i] = i;
  reference->assign(requests->size(), CompletionOutput{});
  for (int round = 0; round < kRounds && !todo.empty(); ++round) {
    std::vector<LongRequest> batch;
    for (size_t i : todo) batch.push_back((*requests)[i]);
    BATON_ASSIGN_OR_RETURN(std::vector<Stream> undisturbed,
                           StreamAll(router.address, model, batch, 0, nullptr));
    std::vector<size_t> again;
    for (size_t k = 0; k < todo.size(); ++k) {
      LongRequest& r = (*requests)[todo[k]];
      if (std::ssize(undisturbed[k].out.token_ids) < r.max_tokens) {
        r.seed += 7919;
        again.push_back(todo[k]);
      } else {
        (*reference)[todo[k]] = undisturbed[k].out;
      }
    }
    todo = std::move(again);
  }
  if (!todo.empty()) {
    return FailedPrecondition("no seed in " + std::to_string(kRounds) + " tries gives stream " +
                              std::to_string(todo.front()) + " a full-length answer");
  }
  return OkStatus();
}

Result<LongModeResult> RunLongMode(const LongModeConfig& c, std::vector<LongRequest>* requests,
                                   std::vector<CompletionOutput>* reference) {
  ::mkdir(c.work_dir.c_str(), 0755);
  PairConfig pc;
  pc.served_name = c.served_name;
  pc.pool_blocks = c.pool_blocks;
  pc.block_bytes = c.block_bytes;
  pc.engine_threads = c.engine_threads;
  if (!c.kv_handoff) pc.engine_args = {"--kv-handoff", "off"};
  BATON_ASSIGN_OR_RETURN(ControllerPair pair,
                         ControllerPair::Start(c.bin_dir, c.model_dir, c.work_dir, pc));
  BATON_ASSIGN_OR_RETURN(
      ServingProcess router,
      StartRouterProcess(c.bin_dir,
                         {"--controller", pair.socket(), "--first-byte-timeout-ms", "600000",
                          "--stream-idle-timeout-ms", "600000", "--max-queue-wait-ms", "600000"},
                         c.work_dir + "/router.log"));
  if (reference->empty())
    BATON_RETURN_IF_ERROR(Reference(router, c.served_name, requests, reference));
  LongModeResult result;
  for (int t = 0; t < c.trials; ++t) {
    BATON_RETURN_IF_ERROR(KillTrial(pair, router, c, *requests, *reference, &result));
    std::fprintf(stderr, "  %s trial %d: next token after the kill %s ms\n",
                 c.kv_handoff ? "warm" : "reprefill", t + 1,
                 [&] {
                   std::string s;
                   for (size_t i = result.next_token_ms.size() - requests->size();
                        i < result.next_token_ms.size(); ++i) {
                     s += (s.empty() ? "" : ", ") + std::to_string(result.next_token_ms[i]);
                   }
                   return s;
                 }()
                     .c_str());
  }
  pair.Stop();
  return result;
}

}  // namespace baton::perf
