#include "perf/pair/failover_trials.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <thread>

#include "base/align.h"
#include "base/clock.h"
#include "base/io/unique_fd.h"
#include "perf/pair/failover_http.h"
#include "perf/weights/weightload_contenders.h"
#include "proto/transport/shared_memory.h"
#include "standby/model/llama_config.h"
#include "weightcache/model_files.h"

namespace baton::perf {

std::string EngineProgram(const PairOptions& opts) {
  return opts.engine.empty() ? opts.bin_dir + "/baton-refengine" : opts.engine;
}

namespace {

using nlohmann::json;
using std::chrono::milliseconds;

constexpr char kServedName[] = "baton-perf";
constexpr uint64_t kBlockHeaderBytes = 64;
constexpr int kMinBlockTokens = 16;
constexpr auto kProbePause = std::chrono::microseconds(200);
// After the pre-kill request, so that the primary dies idle (its workers asleep).
constexpr auto kQuietBeforeKill = std::chrono::milliseconds(250);

double MsSince(TimePoint start) { return MillisBetween(start, RealClock::Get().Now()); }

// An error unless `r` is a 200 completion with one generated token.
Status CheckCompletion(const Result<HttpResponse>& r) {
  if (!r.ok()) return r.status();
  const json j = json::parse(r->body, nullptr, /*allow_exceptions=*/false);
  if (r->status != 200 || !j.is_object() || !j.contains("choices")) {
    return Internal("completion answered " + std::to_string(r->status) + ": " +
                    r->body.substr(0, 200));
  }
  return OkStatus();
}

// Reads every file once, so that its pages are in the page cache.
Status WarmPageCache(const std::vector<std::string>& files) {
  std::vector<char> buf(8 << 20);
  for (const std::string& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) return ErrnoStatus("open " + f, errno);
    while (in.read(buf.data(), static_cast<std::streamsize>(buf.size())) || in.gcount() > 0) {
    }
  }
  return OkStatus();
}

}  // namespace

std::string FirstTokenRequest(int prompt_tokens) {
  constexpr std::string_view kSentence = "Baton hands the pool to the standby.";
  std::vector<int> ids;
  for (int i = 0; i < prompt_tokens; ++i) {
    ids.push_back(static_cast<unsigned char>(kSentence[i % kSentence.size()]));
  }
  return json{
      {"model", kServedName}, {"prompt", ids}, {"max_tokens", 1}, {"temperature", 0}, {"seed", 7}}
      .dump();
}

Result<ModelInfo> DescribeModel(const std::string& dir) {
  BATON_ASSIGN_OR_RETURN(LlamaConfig config, LoadLlamaConfig(dir));
  BATON_ASSIGN_OR_RETURN(ModelFiles files, ModelFiles::Open(dir));
  ModelInfo info;
  info.dir = dir;
  for (const SafetensorsIndex& s : files.shards()) info.files.push_back(s.path());
  info.file_bytes = files.total_file_bytes();
  info.kv_bytes_per_token = static_cast<uint64_t>(config.num_hidden_layers) * 2 *
                            static_cast<uint64_t>(config.kv_dim()) * sizeof(float);
  return info;
}

// ---- Baton ---------------------------------------------------------------------------------

Result<std::unique_ptr<BatonPair>> BatonPair::Start(const ModelInfo& model,
                                                    const PairOptions& opts) {
  std::unique_ptr<BatonPair> pair(new BatonPair(model, opts));
  pair->socket_ = opts.work_dir + "/controller.sock";
  pair->log_ = opts.work_dir + "/controller.log";
  const uint64_t need = kMinBlockTokens * model.kv_bytes_per_token + kBlockHeaderBytes;
  pair->block_bytes_ = RoundUp(need, kHugePageSize);
  pair->block_tokens_ =
      static_cast<int>((pair->block_bytes_ - kBlockHeaderBytes) / model.kv_bytes_per_token);
  BATON_RETURN_IF_ERROR(pair->WriteConfig());
  ::unlink(pair->log_.c_str());  // a fresh log: trials find their lines by pid
  BATON_ASSIGN_OR_RETURN(ChildProcess child,
                         ChildProcess::Spawn({opts.bin_dir + "/baton-controller", "--config",
                                              opts.work_dir + "/controller.toml"},
                                             pair->log_));
  pair->controller_.emplace(std::move(child));
  BATON_RETURN_IF_ERROR(pair->WaitReady(std::chrono::seconds(300)).status());
  BATON_ASSIGN_OR_RETURN(json status,
                         BatonctlJson(opts.bin_dir + "/batonctl", pair->socket_, {"status"}));
  pair->huge_pages_ = status.at("pool").value("huge_pages", false);
  return pair;
}

BatonPair::~BatonPair() { Stop(); }

int BatonPair::Stop() {
  if (!controller_.has_value()) return -1;
  const int code = controller_->Stop(milliseconds(15000));
  controller_.reset();
  return code;
}

Status BatonPair::WriteConfig() {
  std::ofstream out(opts_.work_dir + "/controller.toml");
  out << "[controller]\nruntime_dir = \"" << opts_.work_dir
      << "\"\nepoch_reserve = " << opts_.epoch_reserve << "\n\n"
      << "[model]\ndir = \"" << model_.dir << "\"\n\n"
      << "[engine]\ncommand = [\"" << EngineProgram(opts_) << "\", \"--model\", \"{model_dir}\", "
      << "\"--port\", \"{port}\", \"--controller\", \"{socket}\", \"--token\", \"{token}\", "
      << "\"--role\", \"{role}\", \"--engine-id\", \"{engine_id}\", \"--threads\", \""
      << opts_.engine_threads << "\", \"--served-model-name\", \"" << kServedName << "\"]\n"
      << "log_dir = \"" << opts_.work_dir << "/engines\"\nbase_port = 0\n\n"
      << "[pool]\nblocks = " << opts_.pool_blocks << "\nblock_bytes = " << block_bytes_ << "\n\n"
      << "[policy]\nmax_failures = 1000\n";
  out.close();
  if (!out) return ErrnoStatus("write " + opts_.work_dir + "/controller.toml", errno);
  if (::mkdir((opts_.work_dir + "/engines").c_str(), 0755) != 0 && errno != EEXIST) {
    return ErrnoStatus("mkdir " + opts_.work_dir + "/engines", errno);
  }
  return OkStatus();
}

Result<BatonPair::Engines> BatonPair::WaitReady(std::chrono::seconds limit) {
  const TimePoint start = RealClock::Get().Now();
  std::string last = "no answer";
  while (MsSince(start) < static_cast<double>(limit.count()) * 1000) {
    if (!controller_->Running()) {
      return Internal("baton-controller exited; see " + log_);
    }
    Result<json> s = BatonctlJson(opts_.bin_dir + "/batonctl", socket_, {"status"});
    if (s.ok()) {
      BATON_RETURN_IF_ERROR(CrashLoopStatus(*s, log_));
      last = s->at("pair").value("state", "?");
      Engines e;
      int standbys = 0;
      for (const json& x : s->at("engines")) {
        if (x.value("state", "") == "primary" && x.value("serving", false)) {
          e.primary_pid = x.value("pid", 0);
          e.primary_address = x.value("http_address", "");
        } else if (x.value("state", "") == "standby") {
          e.standby_address = x.value("http_address", "");
          ++standbys;
        }
      }
      if (last == "ready" && e.primary_pid > 0 && standbys == 1 && !e.standby_address.empty()) {
        return e;
      }
    } else {
      last = s.status().ToString();
    }
    std::this_thread::sleep_for(milliseconds(20));
  }
  return DeadlineExceeded("the pair was not ready within " + std::to_string(limit.count()) +
                          " s (last: " + last + "); see " + log_);
}

Result<double> BatonPair::ForwardPassMs() {
  BATON_ASSIGN_OR_RETURN(Engines e, WaitReady(std::chrono::seconds(60)));
  BATON_ASSIGN_OR_RETURN(HttpClient client, HttpClient::Connect(e.primary_address));
  const TimePoint start = RealClock::Get().Now();
  BATON_RETURN_IF_ERROR(
      CheckCompletion(client.Post("/v1/completions", FirstTokenRequest(opts_.prompt_tokens))));
  return MsSince(start);
}

Result<json> BatonPair::TimelineOf(pid_t old_pid) {
  const TimePoint start = RealClock::Get().Now();
  while (MsSince(start) < 10000) {
    Result<json> t = BatonctlJson(opts_.bin_dir + "/batonctl", socket_, {"timeline"});
    if (t.ok() && t->contains("history")) {
      for (const json& r : t->at("history")) {  // ready first, the old primary's barrier after
        if (r.value("old_pid", 0) == old_pid && r.at("phases").contains("ready_ms") &&
            r.at("phases").contains("teardown_ms")) {
          return r;
        }
      }
    }
    std::this_thread::sleep_for(milliseconds(10));
  }
  return DeadlineExceeded("no completed timeline for the failover of pid " +
                          std::to_string(old_pid));
}

Result<FailoverSample> BatonPair::Trial() {
  BATON_ASSIGN_OR_RETURN(Engines e, WaitReady(std::chrono::seconds(120)));
  FailoverSample s;
  {  // a forward pass of the primary that is about to die, after the same idle wait
    BATON_ASSIGN_OR_RETURN(HttpClient primary, HttpClient::Connect(e.primary_address));
    const TimePoint at = RealClock::Get().Now();
    BATON_RETURN_IF_ERROR(
        CheckCompletion(primary.Post("/v1/completions", FirstTokenRequest(opts_.prompt_tokens))));
    s.before_kill_ms = MsSince(at);
  }
  std::this_thread::sleep_for(kQuietBeforeKill);
  BATON_ASSIGN_OR_RETURN(HttpClient probe, HttpClient::Connect(e.standby_address));
  BATON_ASSIGN_OR_RETURN(HttpResponse before, probe.Get("/health"));
  if (before.status == 200) return Internal("the standby already answers /health with 200");

  const int64_t kill_wall_us = WallMicros();
  const TimePoint kill_at = RealClock::Get().Now();
  if (::kill(e.primary_pid, SIGKILL) != 0) {
    return ErrnoStatus("kill -9 " + std::to_string(e.primary_pid), errno);
  }
  for (;;) {
    ++s.probes;
    Result<HttpResponse> h = probe.Get("/health");
    if (h.ok() && h->status == 200) break;
    if (!h.ok()) {  // the connection broke: probe on a new one
      BATON_ASSIGN_OR_RETURN(probe, HttpClient::Connect(e.standby_address));
    }
    if (MsSince(kill_at) > 30000) return DeadlineExceeded("no promoted engine within 30 s");
    std::this_thread::sleep_for(kProbePause);
  }
  s.ready_ms = MsSince(kill_at);
  BATON_RETURN_IF_ERROR(
      CheckCompletion(probe.Post("/v1/completions", FirstTokenRequest(opts_.prompt_tokens))));
  s.first_token_ms = MsSince(kill_at);
  const TimePoint next_at = RealClock::Get().Now();
  BATON_RETURN_IF_ERROR(
      CheckCompletion(probe.Post("/v1/completions", FirstTokenRequest(opts_.prompt_tokens))));
  s.next_request_ms = MsSince(next_at);

  BATON_ASSIGN_OR_RETURN(json record, TimelineOf(e.primary_pid));
  const json& phases = record.at("phases");
  s.fence_ms = phases.value("fence_ms", 0.0);
  s.promote_ms = phases.value("promote_ms", 0.0);
  s.controller_ready_ms = phases.value("ready_ms", 0.0);
  s.teardown_ms = phases.value("teardown_ms", 0.0);
  s.before_barrier = record.at("promotion").value("before_barrier", false);
  const std::string fenced =
      FindLine(log_, {"(pid " + std::to_string(e.primary_pid) + ", ", ") fenced: "});
  if (std::optional<int64_t> at = LogLineMicros(fenced); at.has_value()) {
    s.detect_ms = static_cast<double>(*at - kill_wall_us) / 1000.0;
  }
  return s;
}

// ---- cold restart --------------------------------------------------------------------------

Result<ColdSample> ColdTrial(const ModelInfo& model, const PairOptions& opts, bool evict,
                             int kv_tokens, int index) {
  ColdSample s;
  if (evict) {
    BATON_ASSIGN_OR_RETURN(s.resident_before, Evict(model.files));
  } else {
    BATON_RETURN_IF_ERROR(WarmPageCache(model.files));
    BATON_ASSIGN_OR_RETURN(s.resident_before, ResidentFraction(model.files));
  }
  const std::string tag = std::string(evict ? "evicted" : "warm") + "-" + std::to_string(index);
  const std::string port_file = opts.work_dir + "/cold-" + tag + ".port";
  ::unlink(port_file.c_str());
  const int kv_blocks = (kv_tokens + kMinBlockTokens - 1) / kMinBlockTokens;
  const TimePoint start = RealClock::Get().Now();
  BATON_ASSIGN_OR_RETURN(
      ChildProcess engine,
      ChildProcess::Spawn({EngineProgram(opts), "--model", model.dir, "--port", "0", "--port-file",
                           port_file, "--kv-blocks", std::to_string(kv_blocks), "--threads",
                           std::to_string(opts.engine_threads), "--served-model-name", kServedName},
                          opts.work_dir + "/cold-" + tag + ".log"));
  BATON_ASSIGN_OR_RETURN(const uint16_t port,
                         WaitForPortFile(port_file, engine, std::chrono::minutes(10), kProbePause,
                                         opts.work_dir + "/cold-" + tag + ".log"));
  s.listening_ms = MsSince(start);
  BATON_ASSIGN_OR_RETURN(HttpClient client,
                         HttpClient::Connect("127.0.0.1:" + std::to_string(port)));
  BATON_RETURN_IF_ERROR(
      CheckCompletion(client.Post("/v1/completions", FirstTokenRequest(opts.prompt_tokens))));
  s.first_token_ms = MsSince(start);
  engine.Stop(milliseconds(0));
  return s;
}

}  // namespace baton::perf
