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
#include <cstdio>
#include <cstdlib>
#include <cstring>
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
#include "standby/refengine_flags.h"
#include "standby/sdk/engine_sdk.h"

namespace baton {
namespace {

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
  Engine(const RefEngineFlags& flags, TimePoint start) : flags_(flags), start_(start) {}

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

  const RefEngineFlags& flags_;
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
  BATON_ASSIGN_OR_RETURN(EngineLaunchInfo launch, RefEngineLaunchInfo(flags_));
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
  baton::RefEngineFlags flags;
  if (baton::WantsVersion(argc, argv)) {
    std::printf("%s\n", baton::VersionLine("baton-refengine").c_str());
    return 0;
  }
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::fputs(baton::kRefEngineUsage, stdout);
      return 0;
    }
  }
  if (std::string error = baton::ParseRefEngineFlags(argc, argv, &flags); !error.empty()) {
    std::fprintf(stderr, "baton-refengine: %s\n%s", error.c_str(), baton::kRefEngineUsage);
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
