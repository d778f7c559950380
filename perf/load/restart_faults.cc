#include "perf/load/restart_faults.h"

#include <signal.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <thread>

#include "base/clock.h"
#include "perf/load/load_client.h"
#include "proto/hello.h"
#include "proto/transport/listener.h"

namespace baton::perf {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

constexpr auto kClientTimeout = std::chrono::seconds(60);
constexpr auto kRecoveryLimit = std::chrono::seconds(30);

double SecondsSince(TimePoint t0) {
  return std::chrono::duration<double>(RealClock::Get().Now() - t0).count();
}

TimePoint At(TimePoint t0, double seconds) {
  return t0 + std::chrono::duration_cast<Duration>(std::chrono::duration<double>(seconds));
}

std::set<int> EnginePids(const json& status) {
  std::set<int> pids;
  for (const json& e : status.value("engines", json::array())) pids.insert(e.value("pid", 0));
  return pids;
}

bool PairReady(const json& s) {
  int standbys = 0;
  for (const json& e : s.value("engines", json::array()))
    standbys += e.value("role", "") == "standby";
  return s["pair"].value("state", "") == "ready" && standbys == 1 && PrimaryOf(s).pid > 0;
}

bool CanaryServes(const json& s) {
  const json& current = s["upgrade"]["current"];
  return current.is_object() && current.value("phase", "") == "canary";
}

bool Recovered(const json& s) {
  const json& r = s["controller"]["recovery"];
  return r.value("restarted", false) && !r.value("in_progress", true);
}

uint64_t ReadBytesOf(int pid) {
  std::ifstream io("/proc/" + std::to_string(pid) + "/io");
  std::string key;
  uint64_t value = 0;
  while (io >> key >> value) {
    if (key == "read_bytes:") return value;
  }
  return 0;
}

// What a status says of the recovery: the pair's state, the engines' pids, and what the new
// controller did with the memory and the previous engines (a pair that is ready with other
// engines than before is not recovered).
std::string Describe(const json& s) {
  std::string pids;
  for (int pid : EnginePids(s)) pids += (pids.empty() ? "" : ",") + std::to_string(pid);
  const json& r = s["controller"]["recovery"];
  return s["pair"].value("state", "?") + ", engines " + pids +
         ", memory: " + r.value("memory", std::string("?")) +
         ", fenced: " + std::to_string(r.value("fenced", json::array()).size()) +
         (r.value("in_progress", false) ? ", in progress" : "");
}

// Polls the fast status every millisecond until `done` holds; the status, or an error (at
// once when the pair is down in its crash-loop backoff).
template <typename Pred>
Result<json> PollUntil(const ControllerPair& pair, Pred done, Duration limit) {
  const TimePoint deadline = RealClock::Get().Now() + limit;
  std::string last = "no answer";
  while (RealClock::Get().Now() < deadline) {
    Result<json> s = FastStatus(pair.socket());
    if (s.ok()) BATON_RETURN_IF_ERROR(CrashLoopStatus(*s, pair.log()));
    if (s.ok() && s->contains("pair") && done(*s)) return s;
    last = s.ok() ? Describe(*s) : s.status().message();
    std::this_thread::sleep_for(milliseconds(1));
  }
  return DeadlineExceeded("not recovered in time (last: " + last + ")");
}

// `batonctl upgrade` to the pair's own command with another version label, steps too long
// to pass: the canary serves 10 % until rolled back.
Status StartCanary(const ControllerPair& pair) {
  BATON_ASSIGN_OR_RETURN(json status, pair.Ctl({"status"}));
  std::vector<std::string> args = {"upgrade", "--steps",        "10,50,100", "--step-ms",
                                   "600000",  "--min-requests", "1000000",   "--"};
  for (const json& a : status["upgrade"]["active_command"]) args.push_back(a.get<std::string>());
  args.insert(args.end(), {"--engine-version", "perf-canary"});
  return pair.Ctl(args).status();
}

// Kills the controller (and, during a failover, the primary just before), starts a new one
// and waits for its recovery. Fills the fault's measurements.
void KillAndRestart(ControllerPair& pair, const json& before, RestartFault* f) {
  if (f->kind == "during_failover") {
    ::kill(PrimaryOf(before).pid, SIGKILL);
    std::this_thread::sleep_for(milliseconds(2));  // the controller is fencing now
    f->expected = 1;
  }
  pair.Kill();
  const TimePoint spawned = RealClock::Get().Now();
  if (Status s = pair.Respawn(); !s.ok()) {
    f->error = s.ToString();
    return;
  }
  const std::set<int> pids = EnginePids(before);
  const bool canary = f->kind == "during_canary";
  auto same = [&](const json& s) {
    return Recovered(s) && EnginePids(s) == pids && (canary ? CanaryServes(s) : PairReady(s));
  };
  auto ready = [&](const json& s) {
    return Recovered(s) && (canary ? CanaryServes(s) : PairReady(s));
  };
  Result<json> s = f->kind == "during_failover" ? PollUntil(pair, ready, kRecoveryLimit)
                                                : PollUntil(pair, same, kRecoveryLimit);
  const double ms = MillisBetween(spawned, RealClock::Get().Now());
  if (!s.ok()) {
    f->error = s.status().ToString();
    return;
  }
  f->ready_ms = ms;
  if (f->kind != "during_failover") f->readopt_ms = ms;
  f->same_engines = EnginePids(*s) == pids;
  const json& r = (*s)["controller"]["recovery"];
  if (r["readopt_ms"].is_number()) f->self_readopt_ms = r["readopt_ms"].get<double>();
  f->weights_bytes_read = (*s)["weights"].value("bytes_read", uint64_t{0});
  f->io_read_bytes = ReadBytesOf(pair.pid());
  for (int pid : pids) f->exited += EnginePids(*s).count(pid) == 0;
}

void RunFault(ControllerPair& pair, TimePoint t0, RestartFault* f) {
  if (f->kind == "during_canary") {
    std::this_thread::sleep_until(At(t0, f->at_s - 3));
    Result<json> ready = PollUntil(pair, PairReady, kRecoveryLimit);
    Status started = ready.ok() ? StartCanary(pair) : ready.status();
    Result<json> serving = started.ok() ? PollUntil(pair, CanaryServes, kRecoveryLimit) : started;
    if (!serving.ok()) {
      f->error = "no canary: " + serving.status().ToString();
      return;
    }
  }
  std::this_thread::sleep_until(At(t0, f->at_s));
  Result<json> before = FastStatus(pair.socket());
  if (!before.ok()) {
    f->error = before.status().ToString();
    return;
  }
  f->killed_s = SecondsSince(t0);
  KillAndRestart(pair, *before, f);
  std::fprintf(stderr, "  %.3f s: kill -9 of the controller (%s): %s ready in %.1f ms%s\n",
               f->killed_s, f->kind.c_str(), f->same_engines ? "same engines," : "", f->ready_ms,
               f->error.empty() ? "" : (" ERROR " + f->error).c_str());
  if (f->kind == "during_canary" && f->error.empty()) {
    std::this_thread::sleep_for(std::chrono::seconds(2));
    if (Result<json> back = pair.Ctl({"rollback"}); !back.ok()) f->error = back.status().ToString();
    if (Result<json> ready = PollUntil(pair, PairReady, kRecoveryLimit); !ready.ok()) {
      f->error = "not ready after the rollback: " + ready.status().ToString();
    }
  }
}

}  // namespace

Result<json> FastStatus(const std::string& socket) {
  boost::asio::io_context io;
  BATON_ASSIGN_OR_RETURN(proto::Channel channel, proto::Connect(io, socket));
  BATON_RETURN_IF_ERROR(
      proto::ClientHello(channel,
                         {.peer_name = "perf", .role = proto::PeerRole::kCli, .launch_token = ""})
          .status());
  BATON_RETURN_IF_ERROR(channel.Send(proto::CtlRequest{.command = "status", .args = {}}));
  BATON_ASSIGN_OR_RETURN(proto::ReceivedMessage msg, channel.Receive(std::chrono::seconds(5)));
  BATON_ASSIGN_OR_RETURN(proto::CtlReply reply, msg.As<proto::CtlReply>());
  json j = json::parse(reply.json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return Internal("status is not JSON");
  return j;
}

void RunRestartLoad(const std::string& router, const std::vector<LoadRequest>& requests,
                    int load_count, int clients, ControllerPair& pair,
                    std::vector<RestartFault>* faults, std::vector<LedgerEntry>* entries) {
  const TimePoint t0 = RealClock::Get().Now() + milliseconds(500);
  std::atomic<int> next{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&] {
      LoadClient client(router, kClientTimeout);
      for (int i = next++; i < load_count; i = next++) {
        std::this_thread::sleep_until(At(t0, requests[i].at_s));
        LedgerEntry& e = (*entries)[i];
        e.invoked = true;
        e.sent_s = SecondsSince(t0);
        LoadReply reply = client.Post(requests[i].path, requests[i].body);
        e.end_s = SecondsSince(t0);
        Classify(reply, requests[i].stream, &e);
      }
    });
  }
  for (RestartFault& f : *faults) RunFault(pair, t0, &f);
  for (std::thread& t : threads) t.join();
}

Result<double> PlainRestart(ControllerPair& pair) {
  BATON_ASSIGN_OR_RETURN(json before, PollUntil(pair, PairReady, kRecoveryLimit));
  RestartFault f;
  f.kind = "plain";
  KillAndRestart(pair, before, &f);
  if (!f.error.empty()) return Internal(f.error);
  if (f.weights_bytes_read != 0) return Internal("the restarted controller read weights");
  return f.readopt_ms;
}

Result<double> ColdRestart(ControllerPair& pair, const std::string& runtime_dir) {
  BATON_ASSIGN_OR_RETURN(json before, FastStatus(pair.socket()));
  pair.Kill();
  for (int pid : EnginePids(before)) ::kill(pid, SIGKILL);
  int keeper = 0;
  std::ifstream(runtime_dir + "/keeper.sock.pid") >> keeper;
  if (keeper > 0) ::kill(keeper, SIGKILL);
  std::this_thread::sleep_for(milliseconds(200));  // the engines' exits are seen at once anyway
  const TimePoint spawned = RealClock::Get().Now();
  BATON_RETURN_IF_ERROR(pair.Respawn());
  BATON_RETURN_IF_ERROR(PollUntil(pair, PairReady, std::chrono::seconds(120)).status());
  return MillisBetween(spawned, RealClock::Get().Now());
}

}  // namespace baton::perf
