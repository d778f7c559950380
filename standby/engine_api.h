// EngineApi: the reference engine's HTTP routes, bound to its EngineLoop.
//
//   POST /v1/completions  OpenAI completions (openai/completions_api.h), streamed as server-sent
//                         events when asked; every choice carries its token ids
//   POST /v1/chat/completions  the same for chat messages (openai/chat_api.h)
//   GET  /v1/models       the served model
//   GET  /health          200 {"status":"ok"} while serving; 503 {"status":"standby"} before
//                         promotion, {"status":"stopping"} once stopping
//   GET  /metrics         Prometheus text (engine_metrics.h)
//
// Given engine keys (SetEngineKeys, from BATON_ENGINE_KEYS: proto/http/engine_key.h), every
// route but /health and /metrics answers 401 to a request without `Authorization: Bearer KEY`
// of one of them. Completions are answered 503 unless serving. Each completion is a
// CompletionSession that submits one generation to the loop and turns the loop's token events
// (posted from the compute thread to the session's strand) into the response or stream events; a
// client that goes away, streamed or not, cancels its generation (the HTTP server reads on while a
// request is handled and aborts the exchange at end of stream).
//
// Threads: routes run on the HTTP io_context; StartServing/SetState may be called from any
// thread. The loop set by StartServing must outlive the io_context's handlers.
#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/mutex.h"
#include "proto/http/http_server.h"
#include "standby/engine_loop.h"
#include "standby/engine_metrics.h"
#include "standby/model/byte_tokenizer.h"
#include "standby/model/llama_config.h"

namespace baton {

enum class ServeState { kStandby, kServing, kStopping };

class EngineApi {
 public:
  EngineApi(boost::asio::io_context& io, const LlamaConfig& config, ByteTokenizer tokenizer,
            std::string served_model_name, EngineMetrics* metrics, const Clock& clock);

  void Register(HttpServer* server);
  // Serves completions through `loop` from now on.
  void StartServing(EngineLoop* loop);
  void SetState(ServeState state);
  // Drill: answer `percent` % of completion requests with HTTP 500 (spread evenly: request n
  // fails when floor((n+1)p/100) > floor(np/100)), as a broken build would. 0: none.
  void SetFailPercent(uint32_t percent) { fail_percent_ = percent; }
  // Drill: sample every request with its seed plus `offset` (the answer still names the
  // client's seed), as a build whose sampling changed would: outputs differ. 0: none.
  void SetSeedOffset(uint64_t offset) { seed_offset_ = offset; }
  // The keys a request must carry one of (none: no check). Before Register().
  void SetEngineKeys(std::vector<std::string> keys) { keys_ = std::move(keys); }
  ServeState state() const { return state_.load(); }

 private:
  // /v1/completions (`chat` false) and /v1/chat/completions (`chat` true).
  void HandleCompletions(const std::shared_ptr<HttpExchange>& ex, bool chat);
  void HandleHealth(const std::shared_ptr<HttpExchange>& ex) const;
  void HandleModels(const std::shared_ptr<HttpExchange>& ex) const;
  void HandleMetrics(const std::shared_ptr<HttpExchange>& ex) const;
  // `handler`, behind the engine key check.
  HttpHandler Keyed(HttpHandler handler) const;
  uint64_t RandomSeed();
  std::string NextCompletionId(bool chat);

  boost::asio::io_context& io_;
  const LlamaConfig config_;
  const ByteTokenizer tokenizer_;
  const std::string model_name_;
  EngineMetrics* metrics_;
  const Clock& clock_;
  const int64_t created_;  // unix seconds at start, for /v1/models
  std::atomic<EngineLoop*> loop_{nullptr};
  uint32_t fail_percent_ = 0;
  uint64_t seed_offset_ = 0;
  std::vector<std::string> keys_;
  std::atomic<uint64_t> completions_seen_{0};
  std::atomic<ServeState> state_{ServeState::kStandby};
  Mutex rng_mu_;
  std::mt19937_64 rng_ BATON_GUARDED_BY(rng_mu_);
  const uint64_t id_prefix_;
  std::atomic<uint64_t> next_id_{1};
};

}  // namespace baton
