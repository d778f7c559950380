// baton-refengine: the reference engine. A Llama-architecture decoder computed on the CPU,
// with continuous batching, behind an OpenAI-compatible HTTP API (engine_api.h).
//
//   standalone:  baton-refengine --model DIR [--port N] ...
//   under Baton: baton-refengine --model DIR --controller SOCKET --token T
//                                --role primary|standby --engine-id ID [--port N] ...
//
// Standalone, it loads its own weights the way a typical engine does (plain reads of the
// safetensors files into process memory) and allocates its own KV blocks; its log gives the
// time from process start to weights loaded and to listening, so a cold start can be
// compared with a Baton promotion. Under a controller, the weights are the controller's
// arena mapped read-only and the KV blocks are granted pool extents: the engine listens at
// once, answers 503 {"status":"standby"} until promoted, then serves.
//
// Exit status: 0 after SIGINT/SIGTERM or a controller's stop, 1 on a failure, 2 on bad usage.
#include <unistd.h>

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <thread>

#include "base/build_info.h"
#include "base/clock.h"
#include "base/log.h"
#include "proto/http/engine_key.h"
#include "proto/http/http_server.h"
#include "proto/roles.h"
#include "standby/controller_link.h"
#include "standby/engine_api.h"
#include "standby/engine_loop.h"
#include "standby/kernels/kernels_choice.h"
#include "standby/sdk/engine_sdk.h"

namespace baton {
namespace {

constexpr char kUsage[] =
    "usage: baton-refengine --model DIR [--host H] [--port N] [--port-file F]\n"
    "                       [--kv-blocks N] [--block-tokens T] [--threads K] [--max-batch B]\n"
    "                       [--max-step-tokens S] [--served-model-name NAME]\n"
    "                       [--engine-version LABEL] [--fail-percent P] [--seed-offset N]\n"
    "                       [--kv-handoff on|off] [--kv-format NAME] [--kv-keep-ms N]\n"
    "                       [--step-interval-ms N]\n"
    "                       [--controller SOCKET --token T --role primary|standby\n"
    "                        --engine-id ID]\n"
    "  --model              model directory (config.json; safetensors when standalone)\n"
    "  --host, --port       HTTP address (default 127.0.0.1, port 0 = ephemeral)\n"
    "  --port-file          write the bound port there once serving (standalone) or\n"
    "                       listening (under a controller: a standby answers 503)\n"
    "  --kv-blocks          standalone KV cache blocks (default 1024)\n"
    "  --block-tokens       standalone tokens per KV block (default 16)\n"
    "  --threads            compute threads (default 1)\n"
    "  --max-batch          sequences per step (default 64)\n"
    "  --max-step-tokens    tokens per step, prefill chunks included (default 512)\n"
    "  --served-model-name  the model's name in the API (default: the --model folder's\n"
    "                       name, as the controller names the model in a fleet)\n"
    "  --engine-version     the version reported to the controller (default\n"
    "                       baton-refengine); shown by batonctl status during upgrades\n"
    "  --fail-percent       drill: answer P percent of completion requests with HTTP 500, as a\n"
    "                       broken build would (canary rollback drills); default 0\n"
    "  --seed-offset        drill: sample with each request's seed plus N, as a build whose\n"
    "                       sampling changed would (outputs differ); default 0\n"
    "  --kv-handoff         under a controller: leave a record of each sequence in its KV\n"
    "                       blocks, and on promotion continue the predecessor's sequences\n"
    "                       from theirs (KV-warm failover); default on\n"
    "  --kv-format          the KV format name in the records' identity (default\n"
    "                       baton-refengine-kv/1); engines of other names adopt nothing\n"
    "  --kv-keep-ms         how long adopted KV waits for its request to come back\n"
    "                       (default 30000)\n"
    "  --step-interval-ms   pace: a decoding step at most every N ms, so a stream gets one\n"
    "                       token per N ms, as from a far larger model (demos, drills: a\n"
    "                       stream of a small model lasts long enough to be killed in the\n"
    "                       middle); default 0, as fast as the model computes\n"
    "  --controller ...     run under baton-controller (values it fills in; missing ones\n"
    "                       are read from BATON_SOCKET, BATON_LAUNCH_TOKEN, BATON_ENGINE_ID)\n"
    "                       If the controller goes away the engine serves on and reattaches\n"
    "                       to the next one; BATON_ON_CONTROLLER_ABSENT=stop with\n"
    "                       BATON_CONTROLLER_ABSENT_TIMEOUT_MS=N makes it exit after N ms\n"
    "                       without one (default: serve on for as long as it takes)\n"
    "  BATON_ENGINE_KEYS    keys (comma-separated) of which every request but /health and\n"
    "                       /metrics must carry one as Authorization: Bearer KEY (401\n"
    "                       otherwise); the controller sets it from [engine] key_file\n";

struct Flags {
  std::string model;
  std::string host = "127.0.0.1";
  int port = 0;
  std::string port_file;
  int kv_blocks = 1024;
  int block_tokens = 16;
  int threads = 1;
  int max_batch = 64;
  int max_step_tokens = 512;
  std::string served_name;
  std::string controller;
  std::string token;
  std::string role;
  std::string engine_id;
  std::string engine_version = "baton-refengine";
  int fail_percent = 0;
  int seed_offset = 0;
  bool kv_handoff = true;
  std::string kv_format = "baton-refengine-kv/1";
  int kv_keep_ms = 30000;
  int step_interval_ms = 0;
};

template <typename T>
bool ParseNumber(std::string_view text, T* out) {
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, *out);
  return ec == std::errc() && ptr == end;
}

// Returns an error message, or empty on success.
std::string ParseInt(std::string_view flag, std::string_view v, int lo, int hi, int* out) {
  if (!ParseNumber(v, out) || *out < lo || *out > hi) {
    return std::string(flag) + ": not a number in [" + std::to_string(lo) + ", " +
           std::to_string(hi) + "]: " + std::string(v);
  }
  return "";
}

std::string ApplyFlag(std::string_view arg, std::string_view v, Flags* f) {
  if (arg == "--model")
    f->model = v;
  else if (arg == "--host")
    f->host = v;
  else if (arg == "--port")
    return ParseInt(arg, v, 0, 65535, &f->port);
  else if (arg == "--port-file")
    f->port_file = v;
  else if (arg == "--kv-blocks")
    return ParseInt(arg, v, 1, 1 << 24, &f->kv_blocks);
  else if (arg == "--block-tokens")
    return ParseInt(arg, v, 1, 4096, &f->block_tokens);
  else if (arg == "--threads")
    return ParseInt(arg, v, 1, 256, &f->threads);
  else if (arg == "--max-batch")
    return ParseInt(arg, v, 1, 4096, &f->max_batch);
  else if (arg == "--max-step-tokens")
    return ParseInt(arg, v, 1, 1 << 20, &f->max_step_tokens);
  else if (arg == "--served-model-name")
    f->served_name = v;
  else if (arg == "--controller")
    f->controller = v;
  else if (arg == "--token")
    f->token = v;
  else if (arg == "--role")
    f->role = v;
  else if (arg == "--engine-id")
    f->engine_id = v;
  else if (arg == "--engine-version")
    f->engine_version = v;
  else if (arg == "--fail-percent")
    return ParseInt(arg, v, 0, 100, &f->fail_percent);
  else if (arg == "--seed-offset")
    return ParseInt(arg, v, 0, 1 << 30, &f->seed_offset);
  else if (arg == "--kv-handoff" && (v == "on" || v == "off"))
    f->kv_handoff = v == "on";
  else if (arg == "--kv-handoff")
    return "--kv-handoff must be on or off";
  else if (arg == "--kv-format" && !v.empty())
    f->kv_format = v;
  else if (arg == "--kv-keep-ms")
    return ParseInt(arg, v, 0, 1 << 30, &f->kv_keep_ms);
  else if (arg == "--step-interval-ms")
    return ParseInt(arg, v, 0, 60000, &f->step_interval_ms);
  else
    return "unknown argument: " + std::string(arg);
  return "";
}

std::string ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (i + 1 >= argc) return std::string(arg) + " needs a value";
    if (std::string error = ApplyFlag(arg, argv[++i], f); !error.empty()) return error;
  }
  if (f->model.empty()) return "--model DIR is required";
  // The model folder's name, as the controller's fleet record names the model (fleet.model):
  // a router that routes by that name finds an engine that answers to it.
  if (f->served_name.empty()) {
    const std::filesystem::path dir = std::filesystem::path(f->model).lexically_normal();
    f->served_name =
        dir.filename().empty() ? dir.parent_path().filename().string() : dir.filename().string();
    if (f->served_name.empty()) f->served_name = f->model;
  }
  if (!f->role.empty() && !proto::ParseLaunchRole(f->role).ok()) {
    return "--role must be primary or standby";
  }
  return "";
}

// Fills what the flags leave out from the controller's environment.
Result<EngineLaunchInfo> LaunchInfo(const Flags& f) {
  EngineLaunchInfo info;
  if (f.token.empty() || f.engine_id.empty()) {
    BATON_ASSIGN_OR_RETURN(info, LaunchInfoFromEnv());
  }
  info.socket_path = f.controller;
  if (!f.token.empty()) info.launch_token = f.token;
  if (!f.role.empty()) info.role = f.role;
  if (!f.engine_id.empty() && !ParseNumber(std::string_view(f.engine_id), &info.engine_id)) {
    return InvalidArgument("--engine-id: not a number: " + f.engine_id);
  }
  return info;
}

Status WritePortFile(const std::string& path, uint16_t port) {
  const std::string tmp = path + ".tmp";
  FILE* file = std::fopen(tmp.c_str(), "w");
  if (file == nullptr) return ErrnoStatus(tmp + ": open", errno);
  const bool ok = std::fprintf(file, "%u\n", port) > 0;
  if (std::fclose(file) != 0 || !ok) return ErrnoStatus(tmp + ": write", errno);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return ErrnoStatus(path + ": rename", errno);
  return OkStatus();
}

// The process-wide pieces: the HTTP thread, the API and the start time for phase logs.
class Engine {
 public:
  Engine(const Flags& flags, TimePoint start) : flags_(flags), start_(start) {}

  Status Run();

 private:
  double SinceStart() const { return MillisBetween(start_, clock_.Now()); }
  Status StartHttp(const LlamaConfig& config);
  // Writes --port-file, if given: the HTTP port is bound (and, standalone, serving).
  Status PublishPort() const;
  Status ServeStandalone();
  Status ServeUnderController();
  Result<SessionEvent> WaitForPromotion(EngineSession* session);
  Status BuildModel(ModelMemory* memory);
  void MakeHandoff(EngineSession* session, SessionModelMemory* memory);
  // Makes the compute loop; StartLoop also starts its thread (MakeLoop then loop_->Start()).
  void MakeLoop(EngineLoopHooks hooks);
  void StartLoop(EngineLoopHooks hooks);
  void WaitForSignal() const;
  void StopHttp();

  const Flags& flags_;
  const Clock& clock_ = RealClock::Get();
  const TimePoint start_;
  EngineMetrics metrics_;
  boost::asio::io_context io_;
  std::unique_ptr<HttpServer> server_;
  std::unique_ptr<EngineApi> api_;
  std::thread io_thread_;
  std::atomic<bool> stop_requested_{false};
  // Destroyed in reverse: the loop stops before the model, cache and memory they use go.
  std::unique_ptr<EngineSession> session_;
  std::unique_ptr<ModelMemory> memory_;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<PagedKvCache> cache_;
  std::unique_ptr<KvHandoff> handoff_;
  double copy_gbps_ = 0;  // MeasureCopyGbps(), with a handoff
  std::unique_ptr<EngineLoop> loop_;
};

Status Engine::Run() {
  boost::asio::signal_set signals(io_, SIGINT, SIGTERM);
  signals.async_wait([this](const boost::system::error_code& ec, int sig) {
    if (ec) return;
    BATON_LOG(INFO, "refengine") << "signal " << sig << ": stopping";
    stop_requested_.store(true);
  });
  Status s = flags_.controller.empty() ? ServeStandalone() : ServeUnderController();
  if (api_) api_->SetState(ServeState::kStopping);
  if (loop_) loop_->Stop();
  if (session_) session_->Shutdown();  // unmaps the blocks: after the loop has stopped
  StopHttp();
  return s;
}

Status Engine::StartHttp(const LlamaConfig& config) {
  BATON_ASSIGN_OR_RETURN(ByteTokenizer tokenizer, ByteTokenizer::Create(config));
  HttpServerOptions options;
  options.host = flags_.host;
  options.port = static_cast<uint16_t>(flags_.port);
  options.on_response = [this](int status) { metrics_.CountResponse(status); };
  // Four times the router's default body limit: a replay sends the prompt again as token ids
  // (several bytes a token), and what the router admitted must reach the engine.
  options.body_limit = size_t{32} << 20;
  server_ = std::make_unique<HttpServer>(io_, options);
  api_ = std::make_unique<EngineApi>(io_, config, std::move(tokenizer), flags_.served_name,
                                     &metrics_, clock_);
  api_->SetFailPercent(static_cast<uint32_t>(flags_.fail_percent));
  api_->SetSeedOffset(static_cast<uint64_t>(flags_.seed_offset));
  const char* keys = std::getenv(kEngineKeysEnv);
  BATON_ASSIGN_OR_RETURN(std::vector<std::string> engine_keys,
                         ParseEngineKeys(keys != nullptr ? keys : ""));
  if (!engine_keys.empty()) {
    BATON_LOG(INFO, "refengine") << "engine key: " << engine_keys.size()
                                 << " keys; a request without one gets 401";
  }
  api_->SetEngineKeys(std::move(engine_keys));
  api_->Register(server_.get());
  BATON_RETURN_IF_ERROR(server_->Listen());
  io_thread_ = std::thread([this] { io_.run(); });
  BATON_LOG(INFO, "refengine") << "listening on " << flags_.host << ":" << server_->port() << " ("
                               << SinceStart() << " ms since start)";
  return OkStatus();
}

Status Engine::PublishPort() const {
  if (flags_.port_file.empty()) return OkStatus();
  return WritePortFile(flags_.port_file, server_->port());
}

void Engine::StopHttp() {
  if (!io_thread_.joinable()) return;
  boost::asio::post(io_, [this] {
    if (server_) server_->Close();
  });
  io_.stop();
  io_thread_.join();
}

Status Engine::BuildModel(ModelMemory* memory) {
  ModelOptions options;
  options.threads = flags_.threads;
  BATON_ASSIGN_OR_RETURN(model_, LlamaModel::Create(memory->config(), memory->weights(), options));
  BATON_ASSIGN_OR_RETURN(KvLayout layout, memory->KvLayoutFor(*model_));
  BATON_ASSIGN_OR_RETURN(PagedKvCache cache, PagedKvCache::Create(layout));
  cache_ = std::make_unique<PagedKvCache>(std::move(cache));
  BATON_LOG(INFO, "refengine") << "model built: " << flags_.threads << " compute threads, kernels "
                               << KernelsInUse();
  return OkStatus();
}

void Engine::StartLoop(EngineLoopHooks hooks) {
  MakeLoop(std::move(hooks));
  loop_->Start();
}

void Engine::MakeLoop(EngineLoopHooks hooks) {
  GeneratorOptions options;
  options.max_batch_sequences = flags_.max_batch;
  options.max_step_tokens = flags_.max_step_tokens;
  options.kv_hooks = handoff_.get();
  if (handoff_) hooks.between_steps = [h = handoff_.get()] { h->Expire(); };
  loop_ = std::make_unique<EngineLoop>(model_.get(), cache_.get(), options, &metrics_, clock_,
                                       std::move(hooks));
  loop_->SetStepInterval(std::chrono::milliseconds(flags_.step_interval_ms));
}

void Engine::MakeHandoff(EngineSession* session, SessionModelMemory* memory) {
  if (!flags_.kv_handoff) return;
  KvHandoffOptions options;
  options.identity = KvIdentityFor(flags_.kv_format, *session, memory->config(), cache_->layout());
  options.block_tokens = cache_->layout().block_tokens;
  options.block = [memory](uint32_t block) { return memory->Block(block); };
  options.epoch = [session] { return session->epoch(); };
  options.block_bytes = session->pool().block_bytes;
  options.keep_for = std::chrono::milliseconds(flags_.kv_keep_ms);
  options.clock = &clock_;
  options.metrics = &metrics_;
  handoff_ = std::make_unique<KvHandoff>(cache_.get(), std::move(options));
  copy_gbps_ =
      MeasureCopyGbps();  // a standby's start-up: a copy of a predecessor's kv is timed by it
}

void Engine::WaitForSignal() const {
  while (!stop_requested_.load()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
}

Status Engine::ServeStandalone() {
  BATON_LOG(INFO, "refengine") << "standalone: loading " << flags_.model << " with plain reads";
  const TimePoint load_start = clock_.Now();
  BATON_ASSIGN_OR_RETURN(
      std::unique_ptr<LocalModelMemory> loaded,
      LocalModelMemory::Load(flags_.model, {flags_.kv_blocks, flags_.block_tokens}));
  LocalModelMemory* memory = loaded.get();
  memory_ = std::move(loaded);
  const double load_ms = MillisBetween(load_start, clock_.Now());
  BATON_LOG(INFO, "refengine") << "weights loaded: " << memory->stats().tensors << " tensors, "
                               << memory->stats().bytes_read << " bytes from "
                               << memory->stats().files << " files in " << load_ms << " ms ("
                               << SinceStart() << " ms since start)";
  BATON_RETURN_IF_ERROR(BuildModel(memory));
  BATON_RETURN_IF_ERROR(memory->AddKvBlocks(cache_.get()));
  BATON_LOG(INFO, "refengine") << "model ready: " << cache_->total_blocks() << " kv blocks of "
                               << cache_->layout().block_tokens << " tokens (" << memory->kv_bytes()
                               << " bytes; " << SinceStart() << " ms since start)";
  StartLoop({});
  BATON_RETURN_IF_ERROR(StartHttp(memory->config()));
  api_->StartServing(loop_.get());
  // Only now: whoever waits for the port file may send a completion at once.
  BATON_RETURN_IF_ERROR(PublishPort());
  BATON_LOG(INFO, "refengine") << "serving (" << SinceStart() << " ms since start)";
  WaitForSignal();
  return OkStatus();
}

Status Engine::ServeUnderController() {
  BATON_ASSIGN_OR_RETURN(EngineLaunchInfo launch, LaunchInfo(flags_));
  BATON_ASSIGN_OR_RETURN(LlamaConfig config, LoadLlamaConfig(flags_.model));
  BATON_RETURN_IF_ERROR(StartHttp(config));
  BATON_RETURN_IF_ERROR(PublishPort());  // a standby answers 503 until it is promoted
  EngineSessionOptions options;
  options.launch = launch;
  options.engine_version = flags_.engine_version;
  options.handles_resume = true;  // ControllerLink serves again on kResume
  options.http_address = flags_.host + ":" + std::to_string(server_->port());
  // Serves on while the controller is away, unless BATON_ON_CONTROLLER_ABSENT=stop says to
  // give up after BATON_CONTROLLER_ABSENT_TIMEOUT_MS.
  BATON_RETURN_IF_ERROR(ControllerAbsenceFromEnv(&options));
  BATON_ASSIGN_OR_RETURN(session_, EngineSession::Connect(options));
  EngineSession* session = session_.get();
  BATON_ASSIGN_OR_RETURN(std::unique_ptr<SessionModelMemory> created,
                         SessionModelMemory::Create(session, config));
  SessionModelMemory* memory = created.get();
  memory_ = std::move(created);
  BATON_RETURN_IF_ERROR(BuildModel(memory));
  cache_->SetReachableBlocks(session->pool().block_count);  // a canary's share is a part of it
  BATON_LOG(INFO, "refengine") << "standby ready as " << launch.role << " engine "
                               << launch.engine_id << " (" << SinceStart() << " ms since start)";
  MakeHandoff(session, memory);
  Result<SessionEvent> promoted = WaitForPromotion(session);
  if (!promoted.ok() || stop_requested_.load()) return promoted.status();
  const TimePoint promoted_at = RealClock::Get().Now();
  BATON_RETURN_IF_ERROR(
      AdoptPromotedBlocks(*promoted, session, memory, cache_.get(), handoff_.get(), copy_gbps_)
          .status());
  const TimePoint adopted_at = RealClock::Get().Now();
  MakeLoop(
      {.guard = [session] { return session->CheckEpoch(); },
       .on_step_error = [session](const Status& error) { (void)session->ReportError(error); },
       .between_steps = nullptr,
       .on_progress = [session](uint64_t steps,
                                uint32_t pending) { session->ReportProgress(steps, pending); }});
  // Serving first: a request that comes before the compute thread runs waits in its queue.
  // A new thread may take the core from this one for a while (on a small machine, the time
  // of a whole promotion), so it is started once the engine answers.
  api_->StartServing(loop_.get());  // before the controller routes traffic here
  const TimePoint serving_at = RealClock::Get().Now();
  BATON_RETURN_IF_ERROR(session->MarkServing());
  const TimePoint acked_at = RealClock::Get().Now();
  loop_->Start();
  BATON_LOG(INFO, "refengine") << "promoted in epoch " << promoted->epoch << ": serving with "
                               << cache_->total_blocks() << " kv blocks (" << SinceStart()
                               << " ms since start; blocks taken in "
                               << MillisBetween(promoted_at, adopted_at) << " ms, serving after "
                               << MillisBetween(adopted_at, serving_at) << " ms, acked in "
                               << MillisBetween(serving_at, acked_at) << " ms)";
  ControllerLink link(session, memory, cache_.get(), loop_.get(), api_.get(), handoff_.get(),
                      clock_);
  return link.Pump(stop_requested_);
}

// The promotion; an empty event when told to stop first (by a signal, or by the
// controller's Stop, an orderly end for a standby). A controller that goes away and comes
// back meanwhile is logged: the standby waits on, half-started.
Result<SessionEvent> Engine::WaitForPromotion(EngineSession* session) {
  while (!stop_requested_.load()) {
    Result<SessionEvent> promoted = session->WaitForPromotion(std::chrono::milliseconds(100));
    if (promoted.ok()) return promoted;
    if (promoted.status().code() == StatusCode::kDeadlineExceeded) continue;
    std::optional<SessionEvent> event = session->NextEvent();
    while (event && (event->kind == SessionEventKind::kControllerLost ||
                     event->kind == SessionEventKind::kControllerBack)) {
      BATON_LOG(INFO, "refengine") << "standby: " << ToString(event->kind) << ": " << event->reason;
      event = session->NextEvent();
    }
    if (!event || event->kind != SessionEventKind::kStop) return promoted.status();
    BATON_LOG(INFO, "refengine") << "stopped by the controller before promotion: " << event->reason;
    stop_requested_.store(true);
  }
  return SessionEvent{};
}

}  // namespace
}  // namespace baton

int main(int argc, char** argv) {
  const baton::TimePoint start = baton::RealClock::Get().Now();
  baton::Flags flags;
  if (baton::WantsVersion(argc, argv)) {
    std::printf("%s\n", baton::VersionLine("baton-refengine").c_str());
    return 0;
  }
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::fputs(baton::kUsage, stdout);
      return 0;
    }
  }
  if (std::string error = baton::ParseFlags(argc, argv, &flags); !error.empty()) {
    std::fprintf(stderr, "baton-refengine: %s\n%s", error.c_str(), baton::kUsage);
    return 2;
  }
  BATON_LOG(INFO, "refengine") << "starting (pid " << getpid() << ")";
  baton::Engine engine(flags, start);
  baton::Status s = engine.Run();
  if (!s.ok()) {
    BATON_LOG(ERROR, "refengine") << s.ToString();
    return 1;
  }
  BATON_LOG(INFO, "refengine") << "stopped";
  return 0;
}
