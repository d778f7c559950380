#include "router/upstream/relayed_request.h"

#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <cmath>
#include <utility>

#include "base/log.h"
#include "router/upstream/error_bodies.h"
#include "router/upstream/request_key.h"

namespace baton {
namespace {

namespace asio = boost::asio;
namespace http = boost::beast::http;

constexpr size_t kMaxBufferedBody = 64u << 20;
// An SSE event of a completion is a few hundred bytes; one past this is a broken stream
// (no blank line ever comes), not one to hold in memory.
constexpr size_t kMaxStreamEvent = 4u << 20;
constexpr const char* kUnreadBody =
    "the request body must be a JSON object (RFC 8259: no NaN or Infinity, no number out of "
    "range)";

// An engine going away (502-504), or one whose engine key is not this router's (401): the
// request was not served there, and another engine may serve it.
bool Retryable(int status) {
  return status == 502 || status == 503 || status == 504 || status == 401;
}

// A request key for the routes that generate (their bodies carry it), none for the others.
std::string RequestKeyFor(const std::string& route) {
  if (route != "/v1/completions" && route != "/v1/chat/completions") return "";
  return NewRequestKey();
}

}  // namespace

RelayedRequest::RelayedRequest(asio::any_io_executor strand, std::string route,
                               std::shared_ptr<HttpExchange> exchange, RelayDeps deps)
    : strand_(std::move(strand)),
      route_(std::move(route)),
      exchange_(std::move(exchange)),
      deps_(deps),
      replay_(route_, exchange_->request().body(), RequestKeyFor(route_)),
      arrival_(deps.clock->Now()) {}

void RelayedRequest::Start() {
  if (replay_.generates() && !replay_.body_read()) {
    Finish(400, "");
    return exchange_->RespondError(400, kUnreadBody);
  }
  auto self = shared_from_this();
  std::weak_ptr<RelayedRequest> weak = self;
  exchange_->OnAbort([weak] {
    if (auto r = weak.lock()) {
      asio::post(r->strand_, [r] {
        r->client_gone_ = true;
        r->gone_when_whole_ = r->mode_ == Mode::kStream && r->done_seen_;
        if (r->waiting_ticket_) {
          r->deps_.admission->Cancel(*r->waiting_ticket_);  // frees its place in the queue
        } else if (r->call_) {
          r->call_->Cancel();
        }
      });
    }
  });
  asio::dispatch(strand_, [self] { self->Admit(std::nullopt); });
}

void RelayedRequest::Admit(std::optional<Target> failed) {
  queued_at_ = deps_.clock->Now();
  const bool replay = failed.has_value();
  AdmitRequest request{.replay = replay, .failed = std::move(failed), .model = replay_.model()};
  waiting_ticket_ =
      deps_.admission->Request(std::move(request), [self = shared_from_this()](auto target) {
        asio::post(self->strand_,
                   [self, t = std::move(target)]() mutable { self->OnGrant(std::move(t)); });
      });
}

void RelayedRequest::OnGrant(Result<Target> target) {
  waiting_ticket_.reset();
  deps_.metrics->ObserveQueueWait(MillisBetween(queued_at_, deps_.clock->Now()) / 1e3);
  if (!target.ok() && client_gone_) return Finish(499, "client_gone");
  if (!target.ok() && target.status().code() == StatusCode::kNotFound) {
    return GiveUp(404, "model_not_found", target.status().message());
  }
  if (!target.ok() && target.status().code() == StatusCode::kFailedPrecondition) {
    return GiveUp(503, "out_of_service", target.status().message());
  }
  if (!target.ok()) {
    const bool full = target.status().code() == StatusCode::kResourceExhausted;
    return GiveUp(429, full ? "queue_full" : "queue_timeout", target.status().message());
  }
  target_ = *target;
  if (deps_.outcomes != nullptr) deps_.outcomes->Hold(target_->node, target_->engine_id);
  if (client_gone_) {
    ReleaseTarget();
    return Finish(499, "client_gone");
  }
  StartAttempt();
  WatchTarget();
}

void RelayedRequest::WatchTarget() {
  std::weak_ptr<RelayedRequest> weak = shared_from_this();
  const Target watched = *target_;
  loss_watch_ = deps_.admission->WatchLoss(watched, [weak, watched] {
    auto r = weak.lock();
    if (!r) return;
    asio::post(r->strand_, [r, watched] {
      if (!r->call_ || !r->target_ || !(*r->target_ == watched)) return;
      r->target_lost_ = true;
      r->call_->Cancel();
    });
  });
}

void RelayedRequest::StartAttempt() {
  attempt_started_ = deps_.clock->Now();
  replay_.BeginAttempt();
  const HttpRequest& in = exchange_->request();
  UpstreamRequest req;
  req.method = in.method();
  req.target = replay_.AttemptTarget(std::string(in.target()));
  req.body = in.method() == http::verb::post ? replay_.AttemptBody() : in.body();
  if (auto it = in.find(http::field::content_type); it != in.end()) {
    req.content_type = std::string(it->value());
  }
  if (auto it = in.find(http::field::accept); it != in.end()) req.accept = std::string(it->value());
  if (deps_.engine_key != nullptr) req.authorization = deps_.engine_key->Header();
  mode_ = Mode::kNone;
  status_ = 0;
  body_.clear();
  body_too_large_ = false;
  splitter_ = SseSplitter();
  stream_broken_.clear();
  done_seen_ = false;
  auto self = shared_from_this();
  UpstreamSink sink{.on_head = [self](int status, const std::string& ct,
                                      bool streaming) { self->OnHead(status, ct, streaming); },
                    .on_data = [self](std::string_view bytes) { self->OnData(bytes); },
                    .on_end = [self](UpstreamError e, const std::string& m) { self->OnEnd(e, m); }};
  call_ = StartUpstreamCall(strand_, target_->address, std::move(req), deps_.timeouts,
                            std::move(sink), deps_.pool);
}

void RelayedRequest::OnHead(int status, const std::string& content_type, bool streaming) {
  status_ = status;
  content_type_ = content_type;
  if (status / 100 == 2 && streaming) {
    mode_ = Mode::kStream;
    if (!client_header_sent_) {
      exchange_->BeginStream(status, content_type.empty() ? "text/event-stream" : content_type);
      client_header_sent_ = true;
    }
  } else if (Retryable(status) || (status >= 400 && target_->canary)) {
    // An engine that is going away (502-504), or a canary's 4xx or 5xx: a canary's failures
    // are judged against it, never passed to the client, so the attempt goes to another
    // engine (for a 4xx, whose answer says whether the request was bad for both).
    mode_ = Mode::kRefused;
  } else {
    mode_ = client_header_sent_ ? Mode::kErrorInStream : Mode::kBuffer;
  }
}

void RelayedRequest::OnData(std::string_view bytes) {
  if (!stream_broken_.empty()) return;  // the attempt failed: nothing after the error goes out
  if (mode_ != Mode::kStream) {
    if (mode_ == Mode::kRefused || body_too_large_) return;
    if (body_.size() + bytes.size() > kMaxBufferedBody) {
      body_too_large_ = true;
      body_.clear();
      if (call_) call_->Cancel();
      return;
    }
    body_.append(bytes);
    return;
  }
  std::vector<std::string> events;
  splitter_.Feed(bytes, &events);
  if (splitter_.pending() > kMaxStreamEvent) {
    stream_broken_ = "an event larger than " + std::to_string(kMaxStreamEvent >> 20) + " MiB";
    BATON_LOG(WARN, "router") << "engine " << target_->address << ": " << stream_broken_;
    if (call_) call_->Cancel();
    return;
  }
  for (const std::string& e : events) {
    if (!RelayEvent(e)) return;
  }
}

bool RelayedRequest::RelayEvent(const std::string& event) {
  StreamReplay::Outcome o = replay_.OnEvent(event);
  if (o.engine_failed) {
    stream_broken_ = "a server_error event";
    if (call_) call_->Cancel();
    return false;
  }
  if (!o.to_client.empty()) exchange_->Write(std::move(o.to_client));
  if (deps_.progress != nullptr && target_) {
    if (progress_id_ == 0) {
      progress_id_ = deps_.progress->Begin(target_->node, target_->engine_id, deps_.clock->Now());
    } else {
      deps_.progress->Advanced(progress_id_, deps_.clock->Now());
    }
  }
  if (o.first_token && !first_token_seen_) {
    first_token_seen_ = true;
    deps_.metrics->ObserveFirstToken(route_, MillisBetween(arrival_, deps_.clock->Now()) / 1e3);
  }
  if (o.new_tokens && failed_at_) ObserveContinued();
  if (o.done) done_seen_ = true;
  return true;
}

void RelayedRequest::ObserveContinued() {
  const double ms = MillisBetween(*failed_at_, deps_.clock->Now());
  failed_at_.reset();
  deps_.metrics->ObserveFailoverNextToken(ms / 1e3);
  BATON_LOG(INFO, "router") << route_ << " continued on " << target_->address << ": next token "
                            << std::round(ms * 10) / 10 << " ms after the failure";
}

void RelayedRequest::OnEnd(UpstreamError error, const std::string& cause) {
  call_.reset();
  const std::string message = target_lost_ ? "node " + target_->node + " left the fleet" : cause;
  target_lost_ = false;
  if (client_gone_ && !gone_when_whole_) {
    CountAttempt(AttemptEnd::kEnded);
    ReleaseTarget();
    return Finish(499, "client_gone");
  }
  switch (mode_) {
    case Mode::kStream:
      return OnStreamEnd(error, message);
    case Mode::kBuffer:
      if (body_too_large_) {
        CountAttempt(AttemptEnd::kEnded);
        ReleaseTarget();
        return GiveUp(502, "response_too_large",
                      "the engine's response is larger than " +
                          std::to_string(kMaxBufferedBody >> 20) + " MiB");
      }
      if (error != UpstreamError::kNone) return AttemptFailed(error, message);
      return EndBuffered();
    case Mode::kRefused:
      if (status_ == 401) {  // not held against the engine: the keys differ, not its build
        return AttemptFailed(UpstreamError::kConnect,
                             "the engine refused this router's engine key (401): engine_key_file "
                             "differs from the controller's [engine] key_file",
                             "engine_key", AttemptEnd::kEnded);
      }
      if (target_->canary && status_ / 100 == 4) return RetryCanaryRefusal();
      return AttemptFailed(UpstreamError::kConnect,
                           "the engine answered " + std::to_string(status_));
    case Mode::kErrorInStream:
      CountAttempt(status_ / 100 == 5 ? AttemptEnd::kFailed : AttemptEnd::kEnded);
      ReleaseTarget();
      return GiveUp(status_, "replay_refused",
                    "the engine refused the replay: " + ErrorMessage(body_));
    case Mode::kNone:
      return AttemptFailed(error, message);
  }
}

void RelayedRequest::OnStreamEnd(UpstreamError error, const std::string& message) {
  // With [DONE], or without it once every token was sent (only the tail was lost).
  if (done_seen_ || replay_.finished()) {
    CountAttempt(AttemptEnd::kSucceeded);
    const std::optional<uint64_t> canary = ShadowCanary();
    ReleaseTarget();
    if (!done_seen_) exchange_->Write(replay_.FinishingEvents());
    Finish(200, done_seen_ ? "" : UpstreamErrorName(error));
    exchange_->EndStream();
    if (canary) StartShadow(*canary, replay_.sent_ids());
    return;
  }
  if (!stream_broken_.empty()) return AttemptFailed(UpstreamError::kBroken, stream_broken_);
  if (error == UpstreamError::kNone) {
    return AttemptFailed(UpstreamError::kBroken, "the stream ended without [DONE]");
  }
  AttemptFailed(error, message);
}

void RelayedRequest::EndBuffered() {
  CountAttempt(status_ / 100 == 5 ? AttemptEnd::kFailed : AttemptEnd::kSucceeded);
  const std::optional<uint64_t> canary = status_ / 100 == 2 ? ShadowCanary() : std::nullopt;
  std::string answer = canary ? body_ : std::string();  // parsed once the client has it
  ReleaseTarget();
  Finish(status_, "");
  exchange_->Respond(status_, content_type_.empty() ? "application/json" : content_type_,
                     std::move(body_));
  if (canary) StartShadow(*canary, AnswerTokenIds(answer));
}

void RelayedRequest::AttemptFailed(UpstreamError error, const std::string& message,
                                   const char* kind, AttemptEnd counted) {
  const TimePoint now = deps_.clock->Now();
  const Target failed = *target_;
  CountAttempt(counted);
  ReleaseTarget();
  deps_.metrics->RecordUpstreamError(kind != nullptr ? kind : UpstreamErrorName(error));
  const bool timeout =
      error == UpstreamError::kFirstByteTimeout || error == UpstreamError::kIdleTimeout;
  // An engine sends a whole response's header when generation ends: past the first-byte
  // timeout, a request that is not streamed is slow, not lost. Re-running it elsewhere would
  // only add the same work; a hung engine is fenced by the controller, which breaks the call.
  if (error == UpstreamError::kFirstByteTimeout && !replay_.streaming()) {
    return GiveUp(504, "first_byte_timeout", message);
  }
  if (!replay_.CanContinue()) {
    return GiveUp(timeout ? 504 : 502, "not_replayable",
                  "the engine failed (" + message + ") and this request cannot be continued");
  }
  // A refused connection never reached the engine; anything else may have done work there.
  // The request waits in the queue for an engine that listens; past the queue's wait it gets
  // 429 with Retry-After (nothing was done: the client may send it again), or, once its
  // stream has begun, the error event.
  // A request that keeps finding no engine listening logs its first refusal, not every retry.
  bool refused_again = false;
  if (error == UpstreamError::kConnect) {
    deps_.admission->Unreachable(failed);
    refused_again = unreachable_since_.has_value();
    if (!unreachable_since_) unreachable_since_ = now;
    if (now - *unreachable_since_ >= deps_.unreachable_limit) {
      return GiveUp(429, "unreachable",
                    "no engine could be reached for " +
                        std::to_string(deps_.unreachable_limit.count()) + " ms: " + message);
    }
  } else {
    unreachable_since_.reset();
  }
  if (error != UpstreamError::kConnect && ++migrations_ > deps_.migration_limit) {
    return GiveUp(timeout ? 504 : 502, "migration_limit",
                  "the engine failed (" + message + ") and the request already moved " +
                      std::to_string(deps_.migration_limit) + " times");
  }
  const bool tokens = replay_.tokens_sent() > 0;
  if (!refused_again) deps_.metrics->RecordReplay(tokens);  // one per outage, not per probe
  if (refused_again) {
    BATON_LOG(DEBUG, "router") << route_ << " on " << failed.address << " refused again";
  } else {
    BATON_LOG(INFO, "router") << route_ << " on " << failed.address << " failed (" << message
                              << "): " << (tokens ? "replaying after " : "retrying, ")
                              << replay_.tokens_sent() << " tokens sent";
  }
  // The client's wait for its next token runs from the first failure it did not see end.
  if (tokens && !failed_at_) failed_at_ = now;
  Admit(failed);
}

void RelayedRequest::GiveUp(int status, const std::string& kind, const std::string& message) {
  if (client_header_sent_) {
    deps_.metrics->RecordReplayFailure();
    BATON_LOG(WARN, "router") << route_ << ": stream ended with an error: " << message;
    exchange_->Write(replay_.EndingEvents(message));
    Finish(200, kind);
    return exchange_->EndStream();
  }
  BATON_LOG(WARN, "router") << route_ << ": answered " << status << " (" << kind
                            << "): " << message;
  Finish(status, kind);
  if (status == 429) {
    exchange_->Respond(429, "application/json", HttpErrorJson(429, message),
                       {{"Retry-After", std::to_string(deps_.admission->RetryAfterSeconds())}});
  } else if (kind == "model_not_found") {
    exchange_->RespondJson(404, ModelNotFoundJson(message));
  } else if (kind == "out_of_service") {
    exchange_->RespondJson(503, OutOfServiceJson(message));
  } else {
    exchange_->RespondError(status, message);
  }
}

void RelayedRequest::CountAttempt(AttemptEnd end) {
  if (deps_.outcomes == nullptr || !target_) return;
  SettleCanaryRefusal(end == AttemptEnd::kSucceeded && status_ / 100 == 2);
  switch (end) {
    case AttemptEnd::kSucceeded:
      return deps_.outcomes->RecordSucceeded(target_->node, target_->engine_id,
                                             deps_.clock->Now() - attempt_started_);
    case AttemptEnd::kFailed:
      return deps_.outcomes->RecordFailed(target_->node, target_->engine_id);
    case AttemptEnd::kEnded:
      return deps_.outcomes->RecordEnded(target_->node, target_->engine_id);
  }
}

std::optional<uint64_t> RelayedRequest::ShadowCanary() {
  if (deps_.shadow == nullptr || !target_ || !replay_.reproducible()) return std::nullopt;
  if (mode_ == Mode::kStream && !replay_.ids_known()) return std::nullopt;
  if (!target_->canary || !deps_.shadow->Sample()) return std::nullopt;
  shadow_node_ = target_->node;
  return target_->engine_id;
}

void RelayedRequest::StartShadow(uint64_t canary, std::optional<std::vector<int32_t>> canary_ids) {
  if (!canary_ids) {
    BATON_LOG(DEBUG, "router") << route_ << " on canary engine " << canary
                               << ": no token ids in its answer, nothing compared";
    return;
  }
  deps_.shadow->Start({.route = route_,
                       .body = exchange_->request().body(),
                       .engine_id = canary,
                       .node = shadow_node_,
                       .token_ids = std::move(*canary_ids)});
}

void RelayedRequest::ReleaseTarget() {
  if (progress_id_ != 0) deps_.progress->End(progress_id_);
  progress_id_ = 0;
  if (loss_watch_ != 0) deps_.admission->Unwatch(loss_watch_);
  loss_watch_ = 0;
  if (target_) deps_.admission->Release(*target_);
  if (target_ && deps_.outcomes != nullptr) {
    deps_.outcomes->Release(target_->node, target_->engine_id);
  }
  target_.reset();
}

void RelayedRequest::RetryCanaryRefusal() {
  const Target canary = *target_;
  SettleCanaryRefusal(false);  // an earlier canary's, should a request meet two
  refused_by_canary_ = canary;
  refused_status_ = status_;
  ReleaseTarget();
  // Not an engine failure: the canary stays in rotation and no replay is counted; the bound
  // keeps a request from going round when no other engine takes it.
  if (++migrations_ > deps_.migration_limit) {
    return GiveUp(502, "migration_limit",
                  "the canary answered " + std::to_string(refused_status_) +
                      " and no other engine answered it");
  }
  BATON_LOG(DEBUG, "router") << route_ << ": canary " << canary.address << " answered "
                             << refused_status_ << ": asking another engine";
  Admit(canary);
}

void RelayedRequest::SettleCanaryRefusal(bool answered_2xx) {
  if (!refused_by_canary_ || deps_.outcomes == nullptr) return;
  const Target canary = *std::exchange(refused_by_canary_, std::nullopt);
  // 408 and 429 say the canary was busy, not wrong: never held against it.
  const bool busy = refused_status_ == 408 || refused_status_ == 429;
  if (answered_2xx && !busy) {
    deps_.outcomes->RecordFailed(canary.node, canary.engine_id);
  } else {
    deps_.outcomes->RecordEnded(canary.node, canary.engine_id);
  }
}

void RelayedRequest::Finish(int status, const std::string& upstream_error) {
  if (finished_) return;
  finished_ = true;
  SettleCanaryRefusal(false);
  deps_.metrics->Record(route_, status);
  deps_.metrics->ObserveDuration(route_, MillisBetween(arrival_, deps_.clock->Now()) / 1e3);
  if (!upstream_error.empty() && upstream_error != "none") {
    deps_.metrics->RecordUpstreamError(upstream_error);
  }
}

}  // namespace baton
