#include "perf/load/failover_load_ledger.h"

#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <map>

#include "perf/pair/failover_procs.h"

namespace baton::perf {
namespace {

using nlohmann::json;

constexpr const char* kPrompts[] = {"The primary fails and the standby takes over.",
                                    "Replay on token ids, not on text.",
                                    "Nothing repeated and nothing missing.",
                                    "Requests wait while a promotion runs.",
                                    "The stream goes on where it stopped.",
                                    "A client should not notice a failover.",
                                    "Seeds make sampling repeatable.",
                                    "Every output is compared with a reference."};

constexpr int kProbeMaxTokens = 384;

// The body and path of `r` (a completion, or a chat completion of one user message, as
// r->chat says; streamed as r->stream says): temperature 0.8, `limit` tokens at most.
void SetBody(const std::string& prompt, int limit, uint64_t seed, const std::string& model,
             LoadRequest* r) {
  json body = {{"model", model}, {"temperature", 0.8}, {"seed", seed}};
  if (r->chat) {
    r->path = "/v1/chat/completions";
    body["messages"] = json::array({{{"role", "user"}, {"content", prompt}}});
    body["max_completion_tokens"] = limit;
  } else {
    body["prompt"] = prompt;
    body["max_tokens"] = limit;
  }
  if (r->stream) body["stream"] = true;
  r->body = body.dump();
}

double LatencyMs(const LoadRequest& r, const LedgerEntry& e) { return (e.end_s - r.at_s) * 1000; }

}  // namespace

std::vector<LoadRequest> MakeLoadRequests(int count, double rps, int min_tokens, int max_tokens,
                                          const std::string& model) {
  std::vector<LoadRequest> out;
  const int span = std::max(1, max_tokens - min_tokens + 1);
  for (int i = 0; i < count; ++i) {
    LoadRequest r;
    r.index = i;
    r.stream = i % 2 == 1;
    r.chat = (i / 2) % 2 == 1;
    r.at_s = i / rps;
    SetBody(std::string(kPrompts[i % 8]) + " #" + std::to_string(i), min_tokens + (i * 7) % span,
            1000 + i, model, &r);
    out.push_back(std::move(r));
  }
  return out;
}

LoadRequest MakeProbeRequest(int index, double at_s, uint64_t seed, const std::string& model,
                             bool chat) {
  LoadRequest r;
  r.index = index;
  r.stream = true;
  r.chat = chat;
  r.at_s = at_s;
  SetBody("A long stream, cut by a fault.", kProbeMaxTokens, seed, model, &r);
  return r;
}

const char* OutcomeName(Outcome o) {
  switch (o) {
    case Outcome::kOk:
      return "ok";
    case Outcome::kRejected:
      return "rejected";
    case Outcome::kLost:
      return "lost";
  }
  return "?";
}

void Classify(const LoadReply& reply, bool stream, LedgerEntry* e) {
  e->status = reply.status;
  if (reply.status == 0) {
    e->outcome = Outcome::kLost;
    e->reason = reply.got_header ? "response cut: " + reply.error : reply.error;
    return;
  }
  if (reply.status == 429) {
    e->outcome = Outcome::kRejected;
    e->reason = "HTTP 429" + (reply.retry_after.empty() ? std::string(" without Retry-After")
                                                        : " Retry-After " + reply.retry_after);
    return;
  }
  if (reply.status != 200) {
    e->outcome = Outcome::kLost;
    e->reason = "HTTP " + std::to_string(reply.status);
    return;
  }
  e->output = ParseCompletion(reply.body, stream);
  if (!e->output.error.empty()) {
    e->outcome = Outcome::kLost;
    e->reason = e->output.error.substr(0, 200);
    return;
  }
  e->outcome = Outcome::kOk;
}

bool RepeatsTokens(const std::vector<int32_t>& got, const std::vector<int32_t>& want) {
  if (got.size() <= want.size()) return false;
  const size_t d = got.size() - want.size();
  for (size_t k = d; k <= want.size(); ++k) {  // got = want[0..k) + want[k-d..)
    if (std::equal(got.begin(), got.begin() + static_cast<ptrdiff_t>(k), want.begin()) &&
        std::equal(got.begin() + static_cast<ptrdiff_t>(k), got.end(),
                   want.begin() + static_cast<ptrdiff_t>(k - d))) {
      return true;
    }
  }
  return false;
}

void CompareWithReference(const std::vector<Reference>& refs, std::vector<LedgerEntry>* entries) {
  for (size_t i = 0; i < entries->size() && i < refs.size(); ++i) {
    LedgerEntry& e = (*entries)[i];
    if (e.outcome != Outcome::kOk) continue;
    const Reference& want = refs[i];
    if (e.output.token_ids == want.token_ids && e.output.text == want.text) continue;
    e.duplicated = RepeatsTokens(e.output.token_ids, want.token_ids);
    e.mismatched = !e.duplicated;
  }
}

json Summarize(const std::vector<LoadRequest>& requests, const std::vector<LedgerEntry>& entries,
               const std::vector<Fault>& faults, double window_s) {
  auto in_window = [&](size_t i, const Fault& f) {
    return f.at_s >= 0 && requests[i].at_s <= f.at_s + window_s && entries[i].end_s >= f.at_s;
  };
  int invoked = 0, ok = 0, rejected = 0, lost = 0, duplicated = 0, mismatched = 0, ids_changed = 0;
  double late_ms = 0;
  std::map<std::string, int> lost_reasons;
  std::vector<double> steady, failover;
  for (size_t i = 0; i < entries.size(); ++i) {
    const LedgerEntry& e = entries[i];
    if (!e.invoked) continue;
    ++invoked;
    late_ms = std::max(late_ms, (e.sent_s - requests[i].at_s) * 1000);
    if (e.outcome == Outcome::kRejected) ++rejected;
    if (e.outcome == Outcome::kLost) {
      ++lost;
      ++lost_reasons[e.reason];
    }
    if (e.outcome != Outcome::kOk) continue;
    ++ok;
    duplicated += e.duplicated ? 1 : 0;
    mismatched += e.mismatched ? 1 : 0;
    ids_changed += e.output.ids.size() > 1 || e.output.created.size() > 1 ? 1 : 0;
    const bool windowed =
        std::any_of(faults.begin(), faults.end(), [&](const Fault& f) { return in_window(i, f); });
    (windowed ? failover : steady).push_back(LatencyMs(requests[i], e));
  }
  json per_fault = json::array();
  for (const Fault& f : faults) {
    const char* signal = f.kind == "kill"   ? "SIGKILL"
                         : f.kind == "hang" ? "SIGSTOP"
                                            : "batonctl upgrade";
    json x = {{"kind", f.kind},           {"signal", signal},
              {"at_s", f.at_s},           {"pid", f.pid},
              {"engine_id", f.engine_id}, {"stream_in_flight", f.stream_in_flight}};
    if (!f.error.empty()) x["error"] = f.error;
    int n = 0, fok = 0, frej = 0, flost = 0, in_flight = 0;
    std::vector<double> lat;
    for (size_t i = 0; i < entries.size(); ++i) {
      if (!entries[i].invoked || !in_window(i, f)) continue;
      ++n;
      in_flight += entries[i].sent_s <= f.at_s && entries[i].end_s >= f.at_s;
      const Outcome o = entries[i].outcome;
      fok += o == Outcome::kOk;
      frej += o == Outcome::kRejected;
      flost += o == Outcome::kLost;
      if (o == Outcome::kOk) lat.push_back(LatencyMs(requests[i], entries[i]));
    }
    x.update({{"requests", n},
              {"in_flight_at_fault", in_flight},
              {"ok", fok},
              {"rejected", frej},
              {"lost", flost},
              {"p50_ms", Percentile(lat, 50)},
              {"p99_ms", Percentile(lat, 99)},
              {"max_ms", Percentile(lat, 100)},
              {"promotion", f.promotion}});
    if (!f.upgrade.is_null()) x["upgrade"] = f.upgrade;
    if (f.probe >= 0 && static_cast<size_t>(f.probe) < entries.size()) {
      const LedgerEntry& e = entries[f.probe];
      x["probe"] = {{"index", f.probe},
                    {"route", requests[f.probe].path},
                    {"outcome", OutcomeName(e.outcome)},
                    {"reason", e.reason},
                    {"tokens", e.output.token_ids.size()},
                    {"mismatched", e.mismatched},
                    {"duplicated", e.duplicated},
                    {"latency_ms", LatencyMs(requests[f.probe], e)}};
    }
    per_fault.push_back(x);
  }
  return {{"invoked", invoked},
          {"ok", ok},
          {"rejected", rejected},
          {"lost", lost},
          {"duplicated", duplicated},
          {"mismatched", mismatched},
          {"steady_p50_ms", Percentile(steady, 50)},
          {"steady_p99_ms", Percentile(steady, 99)},
          {"failover_p50_ms", Percentile(failover, 50)},
          {"failover_p99_ms", Percentile(failover, 99)},
          {"failover_max_ms", Percentile(failover, 100)},
          {"steady_requests", steady.size()},
          {"failover_requests", failover.size()},
          {"lost_reasons", lost_reasons},
          {"chunk_id_changed", ids_changed},
          {"client_late_max_ms", late_ms},
          {"faults", per_fault}};
}

Status WriteLedger(const std::string& path, const std::vector<LoadRequest>& requests,
                   const std::vector<LedgerEntry>& entries) {
  std::ofstream out(path);
  for (size_t i = 0; i < entries.size(); ++i) {
    const LedgerEntry& e = entries[i];
    const LoadRequest& r = requests[i];
    json line = {{"i", r.index},
                 {"stream", r.stream},
                 {"invoked", e.invoked},
                 {"at_s", r.at_s},
                 {"sent_s", e.sent_s},
                 {"end_s", e.end_s},
                 {"latency_ms", LatencyMs(r, e)},
                 {"status", e.status},
                 {"outcome", OutcomeName(e.outcome)},
                 {"reason", e.reason},
                 {"duplicated", e.duplicated},
                 {"mismatched", e.mismatched},
                 {"tokens", e.output.token_ids.size()},
                 {"chunks", e.output.chunks},
                 {"chunk_ids", e.output.ids}};
    out << line.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
  }
  out.close();
  if (!out) return ErrnoStatus("write " + path, errno);
  return OkStatus();
}

Result<std::string> PlotLatency(const std::string& dir, const std::vector<LoadRequest>& requests,
                                const std::vector<LedgerEntry>& entries,
                                const std::vector<Fault>& faults, const std::string& title) {
  {
    std::ofstream dat(dir + "/latency.dat");
    dat << "# start_s latency_ms outcome(0 ok, 1 rejected, 2 lost, 3 ok but differs)\n";
    for (size_t i = 0; i < entries.size(); ++i) {
      const LedgerEntry& e = entries[i];
      if (!e.invoked) continue;
      int code = static_cast<int>(e.outcome);
      if (e.outcome == Outcome::kOk && (e.mismatched || e.duplicated)) code = 3;
      dat << requests[i].at_s << " " << std::max(0.01, LatencyMs(requests[i], e)) << " " << code
          << "\n";
    }
  }
  const std::string png = dir + "/failover_load.png";
  std::ofstream gp(dir + "/failover_load.gp");
  gp << "set terminal pngcairo size 1400,700 noenhanced\n"
     << "set output '" << png << "'\n"
     << "set title '" << title << "'\n"
     << "set xlabel 'request start (s after the load started)'\n"
     << "set ylabel 'latency (ms), from the scheduled start to the last byte'\n"
     << "set logscale y\nset grid\nset key inside bottom right opaque box\n";
  for (const Fault& f : faults) {
    if (f.at_s < 0) continue;
    const char* what = f.kind == "kill"      ? "kill -9 primary"
                       : f.kind == "hang"    ? "SIGSTOP primary"
                       : f.kind == "upgrade" ? "batonctl upgrade"
                                             : "batonctl upgrade (broken build)";
    gp << "set arrow from " << f.at_s << ", graph 0 to " << f.at_s
       << ", graph 1 nohead lw 2 dt 2 lc rgb 'red'\n"
       << "set label '" << what << " (pid " << f.pid << ")' at " << f.at_s
       << ", graph 0.97 offset 0.5,0 tc rgb 'red'\n";
  }
  gp << "plot '" << dir << "/latency.dat' using 1:($3==0?$2:1/0) with points pt 7 ps 0.5 "
     << "lc rgb '#1f77b4' title 'ok', \\\n"
     << "  '' using 1:($3==1?$2:1/0) with points pt 9 ps 0.9 lc rgb '#ff7f0e' title 'rejected "
        "(429)', \\\n"
     << "  '' using 1:($3==2?$2:1/0) with points pt 2 ps 1.2 lc rgb '#d62728' title 'lost', \\\n"
     << "  '' using 1:($3==3?$2:1/0) with points pt 6 ps 1.2 lc rgb '#9467bd' title 'ok, "
        "differs from reference'\n";
  gp.close();
  if (!gp) return ErrnoStatus("write " + dir + "/failover_load.gp", errno);
  const std::string cmd = "gnuplot '" + dir + "/failover_load.gp' > '" + dir + "/gnuplot.log' 2>&1";
  const int rc = std::system(cmd.c_str());
  if (rc != 0) {
    return Unavailable("gnuplot failed (exit " + std::to_string(WEXITSTATUS(rc)) + "; is it " +
                       "installed? scripts/install-deps); see " + dir + "/gnuplot.log");
  }
  return png;
}

}  // namespace baton::perf
