#include "standby/engine_api.h"

#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <utility>

#include "base/log.h"
#include "proto/http/engine_key.h"
#include "standby/openai/chat_api.h"
#include "standby/openai/completions_api.h"

namespace baton {
namespace {

namespace net = boost::asio;
namespace http = boost::beast::http;

int64_t UnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

const char* FinishName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    default:
      return "";
  }
}

void RespondApiError(HttpExchange* ex, const ApiError& error) {
  ex->RespondJson(error.http_status, ErrorBody(error));
}

// One completion request: from the submitted generation to the response or the stream.
// Every member is touched on the session's strand only.
class CompletionSession : public std::enable_shared_from_this<CompletionSession> {
 public:
  struct Deps {
    EngineLoop* loop;
    const ByteTokenizer* tokenizer;
    EngineMetrics* metrics;
    const Clock* clock;
  };

  CompletionSession(net::io_context& io, std::shared_ptr<HttpExchange> ex, CompletionRequest req,
                    CompletionHeader header, Deps deps)
      : strand_(net::make_strand(io)),
        ex_(std::move(ex)),
        req_(std::move(req)),
        header_(std::move(header)),
        deps_(deps),
        text_(req_.stop),
        arrival_(deps.clock->Now()) {
    // A replayed request: its last resume_tokens prompt ids were already sent to the client.
    const size_t original = req_.prompt_ids.size() - static_cast<size_t>(req_.resume_tokens);
    original_prompt_.assign(req_.prompt_ids.begin(), req_.prompt_ids.begin() + original);
    for (size_t i = original; i < req_.prompt_ids.size(); ++i) {
      text_.AppendUnstoppable(deps_.tokenizer->DecodeToken(req_.prompt_ids[i]));
    }
    resumed_text_ = text_.text().size();
  }

  // Submits the generation; events and aborts are handled on the session's strand.
  void Start() {
    net::dispatch(strand_, [self = shared_from_this()] { self->Submit(); });
  }

 private:
  void Submit() {
    GenerationRequest gen;
    gen.prompt = req_.prompt_ids;
    gen.max_tokens = req_.max_tokens;
    gen.sampling = {req_.temperature, req_.top_p, req_.seed};
    gen.stop_at_eos = !req_.ignore_eos;
    gen.stop_token_ids = req_.stop_token_ids;
    gen.min_tokens = req_.min_tokens;
    gen.key = req_.key;
    id_ = deps_.loop->Submit(std::move(gen), [self = shared_from_this()](const EngineEvent& e) {
      net::post(self->strand_, [self, e] { self->OnEvent(e); });
    });
    std::weak_ptr<CompletionSession> weak = weak_from_this();
    ex_->OnAbort([weak] {
      if (auto self = weak.lock()) net::post(self->strand_, [self] { self->OnAbort(); });
    });
  }

  void OnAbort() {
    if (finished_) return;
    finished_ = true;
    deps_.loop->Cancel(id_);
    BATON_LOG(DEBUG, "api") << header_.id << ": client went away; generation cancelled";
  }

  void OnEvent(const EngineEvent& e) {
    if (finished_) return;
    if (!e.error.ok()) return Fail(e.error);
    if (token_ids_.empty()) {
      deps_.metrics->ObserveTimeToFirstToken(MillisBetween(arrival_, deps_.clock->Now()) / 1e3);
    }
    token_ids_.push_back(e.token.token);
    std::string piece = AppendText(e.token.token, e.token.finish);
    FinishReason finish = e.token.finish;
    if (text_.stopped()) {  // a stop string wins over the length limit of the same token
      if (finish == FinishReason::kNone) deps_.loop->Cancel(id_);
      finish = FinishReason::kStop;
    }
    if (finish != FinishReason::kNone) {
      piece += text_.Finish();
      finished_ = true;
    }
    if (req_.stream) return StreamToken(e.token.token, piece, finish);
    if (finished_) {
      const std::string text = text_.text().substr(resumed_text_);
      ex_->RespondJson(200, req_.chat ? ChatBody(header_, text, FinishName(finish), token_ids_,
                                                 original_prompt_, Usage())
                                      : CompletionBody(header_, text, FinishName(finish),
                                                       token_ids_, original_prompt_, Usage()));
    }
  }

  // The text the token lets out. One that ends the request as a stop id (eos or
  // stop_token_ids) has none, as in vLLM; stop strings are looked for only from the token
  // after the first min_tokens on (vLLM's min_tokens).
  std::string AppendText(int32_t token, FinishReason finish) {
    if (finish == FinishReason::kStop) return "";
    const std::string bytes = deps_.tokenizer->DecodeToken(token);
    return std::cmp_greater(token_ids_.size(), req_.min_tokens) ? text_.Append(bytes)
                                                                : text_.AppendUnstoppable(bytes);
  }

  void StreamToken(int32_t token, const std::string& piece, FinishReason finish) {
    const bool first = !streaming_;
    if (first) {
      ex_->BeginStream(200, "text/event-stream");
      streaming_ = true;
    }
    const std::vector<int32_t>* prompt = first ? &original_prompt_ : nullptr;
    ex_->Write(
        SseEvent(req_.chat ? ChatChunk(header_, piece, FinishName(finish), {token}, prompt)
                           : CompletionChunk(header_, piece, FinishName(finish), {token}, prompt)));
    if (finish == FinishReason::kNone) return;
    if (req_.include_usage) {
      ex_->Write(
          SseEvent(req_.chat ? ChatUsageChunk(header_, Usage()) : UsageChunk(header_, Usage())));
    }
    ex_->Write(SseDone());
    ex_->EndStream();
  }

  void Fail(const Status& error) {
    finished_ = true;
    BATON_LOG(WARN, "api") << header_.id << ": " << error.ToString();
    const ApiError api = ApiErrorFromStatus(error);
    if (!streaming_) return RespondApiError(ex_.get(), api);
    ex_->Write(SseEvent(ErrorBody(api)));
    ex_->Write(SseDone());
    ex_->EndStream();
  }

  CompletionUsage Usage() const {
    return {static_cast<int64_t>(original_prompt_.size()),
            static_cast<int64_t>(req_.resume_tokens + token_ids_.size())};
  }

  net::strand<net::io_context::executor_type> strand_;
  std::shared_ptr<HttpExchange> ex_;
  const CompletionRequest req_;
  const CompletionHeader header_;
  const Deps deps_;
  CompletionText text_;
  const TimePoint arrival_;
  uint64_t id_ = 0;
  std::vector<int32_t> token_ids_;
  std::vector<int32_t> original_prompt_;  // the prompt without the resumed tokens
  size_t resumed_text_ = 0;               // text released by the resumed tokens (not sent)
  bool streaming_ = false;
  bool finished_ = false;
};

}  // namespace

EngineApi::EngineApi(net::io_context& io, const LlamaConfig& config, ByteTokenizer tokenizer,
                     std::string served_model_name, EngineMetrics* metrics, const Clock& clock)
    : io_(io),
      config_(config),
      tokenizer_(std::move(tokenizer)),
      model_name_(std::move(served_model_name)),
      metrics_(metrics),
      clock_(clock),
      created_(UnixSeconds()),
      rng_(std::random_device{}()),
      id_prefix_(rng_() & 0xffffffffu) {}

HttpHandler EngineApi::Keyed(HttpHandler handler) const {
  if (keys_.empty()) return handler;
  return [this, handler = std::move(handler)](std::shared_ptr<HttpExchange> ex) {
    if (!BearerMatches(ex->request(), keys_)) return RespondEngineKeyMissing(ex.get());
    handler(std::move(ex));
  };
}

void EngineApi::Register(HttpServer* server) {
  server->Route(http::verb::post, "/v1/completions",
                Keyed([this](std::shared_ptr<HttpExchange> ex) { HandleCompletions(ex, false); }));
  server->Route(http::verb::post, "/v1/chat/completions",
                Keyed([this](std::shared_ptr<HttpExchange> ex) { HandleCompletions(ex, true); }));
  server->Route(http::verb::get, "/v1/models",
                Keyed([this](std::shared_ptr<HttpExchange> ex) { HandleModels(ex); }));
  server->Route(http::verb::get, "/health",
                [this](std::shared_ptr<HttpExchange> ex) { HandleHealth(ex); });
  server->Route(http::verb::get, "/metrics",
                [this](std::shared_ptr<HttpExchange> ex) { HandleMetrics(ex); });
}

void EngineApi::StartServing(EngineLoop* loop) {
  loop_.store(loop);
  SetState(ServeState::kServing);
}

void EngineApi::SetState(ServeState state) {
  state_.store(state);
  metrics_->SetServing(state == ServeState::kServing);
}

uint64_t EngineApi::RandomSeed() {
  MutexLock lock(rng_mu_);
  return rng_() >> 1;  // fits in a JSON integer of any signedness
}

std::string EngineApi::NextCompletionId(bool chat) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%s-%08llx%08llx", chat ? "chatcmpl" : "cmpl",
                static_cast<unsigned long long>(id_prefix_),
                static_cast<unsigned long long>(next_id_.fetch_add(1)));
  return buf;
}

void EngineApi::HandleCompletions(const std::shared_ptr<HttpExchange>& ex, bool chat) {
  EngineLoop* loop = loop_.load();
  if (state_.load() != ServeState::kServing || loop == nullptr) {
    ApiError e = MakeApiError(503, state_.load() == ServeState::kStandby
                                       ? "this engine is a standby and does not serve yet"
                                       : "this engine is stopping");
    return ex->Respond(503, "application/json", ErrorBody(e), {{"Retry-After", "1"}});
  }
  if (fail_percent_ > 0) {
    const uint64_t n = completions_seen_.fetch_add(1);
    if ((n + 1) * fail_percent_ / 100 > n * fail_percent_ / 100) {
      return RespondApiError(ex.get(), MakeApiError(500, "injected failure (--fail-percent)"));
    }
  }
  CompletionContext ctx{&config_, &tokenizer_, model_name_, RandomSeed()};
  ParsedCompletion parsed = chat ? ParseChatCompletionRequest(ex->request().body(), ctx)
                                 : ParseCompletionRequest(ex->request().body(), ctx);
  if (parsed.error) return RespondApiError(ex.get(), *parsed.error);
  CompletionHeader header{NextCompletionId(chat), UnixSeconds(), model_name_, parsed.request.seed};
  parsed.request.seed += seed_offset_;
  auto session = std::make_shared<CompletionSession>(
      io_, ex, std::move(parsed.request), std::move(header),
      CompletionSession::Deps{loop, &tokenizer_, metrics_, &clock_});
  session->Start();
}

void EngineApi::HandleHealth(const std::shared_ptr<HttpExchange>& ex) const {
  switch (state_.load()) {
    case ServeState::kServing:
      return ex->RespondJson(200, R"({"status":"ok"})");
    case ServeState::kStandby:
      return ex->RespondJson(503, R"({"status":"standby"})");
    case ServeState::kStopping:
      return ex->RespondJson(503, R"({"status":"stopping"})");
  }
}

void EngineApi::HandleModels(const std::shared_ptr<HttpExchange>& ex) const {
  nlohmann::ordered_json model;
  model["id"] = model_name_;
  model["object"] = "model";
  model["created"] = created_;
  model["owned_by"] = "baton";
  model["max_model_len"] = config_.max_position_embeddings;
  nlohmann::ordered_json list;
  list["object"] = "list";
  list["data"] = nlohmann::ordered_json::array({model});
  ex->RespondJson(200, list.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

void EngineApi::HandleMetrics(const std::shared_ptr<HttpExchange>& ex) const {
  ex->Respond(200, "text/plain; version=0.0.4; charset=utf-8", metrics_->Render());
}

}  // namespace baton
