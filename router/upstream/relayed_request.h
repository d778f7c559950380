// RelayedRequest: one client request through the router, from admission to its last byte,
// across as many engine attempts as a failover needs.
//
// It asks Admission for an engine, runs an UpstreamCall there and relays the answer: a
// stream event by event (through StreamReplay, which records what the client got), any
// other response whole. When the attempt fails (the engine refused the connection, reset
// it, stalled past a timeout, answered 502/503/504 (a canary: any 5xx or 4xx, so that a
// canary's failures are judged but never seen by the client) or sent a `server_error` event), the
// request goes back to Admission as a replay and continues on the next engine: a whole
// retry when nothing was sent yet, a replay on token ids otherwise. Attempts that reached an
// engine count against `migration_limit`; connection refusals do not: the refusing address
// is marked in Admission (Unreachable: no request goes there until the route changes), the
// request waits in the queue, and after `unreachable_limit` (the queue wait) of refusals it
// gets 429 with Retry-After, as when no engine came in time. An engine's 401 (it wants an
// engine key other than the router's: EngineKeySource) is such a refusal too, counted as kind
// engine_key in baton_router_upstream_errors_total and not held against the engine (its
// outcome just ended: a canary is not judged by keys). When the request cannot go on
// otherwise, a stream ends with an explicit error event and [DONE]; a response not yet begun
// gets 502. Engine answers 4xx, and 500 from a primary, go to the client
// unchanged.
// Every attempt's body carries the request's key (NewRequestKey(), drawn once here) as
// `baton_request_key`, by which the next engine finds the KV cache a failed one left. After a
// failure with tokens sent, the time to the continuation's first new token is observed
// (baton_router_failover_next_token_seconds) and logged.
// A request refused because the operator took the service out of service (`batonctl drain`:
// Admitter's FailedPrecondition) gets 503 at once, code `out_of_service`, a replay too (its
// stream, once begun, ends with the error event instead).
// In a fleet (FleetAdmission) the request goes to a node serving its `model` (404 when none
// ever did), and an attempt whose node leaves the fleet (Admitter::WatchLoss) is cut and
// replayed on another node like any failed attempt.
// Each attempt's end is counted against its engine in EngineOutcomes: failed (what is replayed
// above, and an answer 5xx), succeeded (a whole answer relayed), or just ended. A canary's 4xx
// is counted once the next engine has answered: failed when that one answered 2xx (a canary
// that refuses what the primary serves, say a model name it lacks), else just ended (the
// request was bad for both); a 408 or 429 (busy, not wrong) always just ended. A stream's
// events, from its first, are noted in EngineProgress until the attempt ends.
// A canary's successful answer to a reproducible request (StreamReplay::reproducible()) is
// offered to the ShadowComparer once the client's answer is finished: its token ids (those sent
// in the stream, or those of the whole body) are compared with the primary's.
//
// Ownership: keeps itself alive (shared_ptr) until the client's exchange ends.
// Thread: everything runs on the request's strand; Admission's grants are posted to it.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <memory>
#include <optional>
#include <string>

#include "base/clock.h"
#include "proto/http/http_server.h"
#include "router/admitter.h"
#include "router/canary/engine_outcomes.h"
#include "router/canary/engine_progress.h"
#include "router/canary/shadow_comparer.h"
#include "router/router_metrics.h"
#include "router/stream/sse_splitter.h"
#include "router/stream/stream_replay.h"
#include "router/upstream/engine_key_source.h"
#include "router/upstream/upstream_call.h"

namespace baton {

struct RelayDeps {
  Admitter* admission = nullptr;
  RouterMetrics* metrics = nullptr;
  const Clock* clock = nullptr;
  UpstreamTimeouts timeouts;
  int migration_limit = 3;
  // How long attempts that never reach an engine (refused, answered 502/503/504) go on.
  std::chrono::milliseconds unreachable_limit{5000};
  UpstreamPool* pool = nullptr;  // keep-alive connections to engines (may be null)
  // Each attempt's end, by engine, its engine held while it has a target (may be null).
  EngineOutcomes* outcomes = nullptr;
  ShadowComparer* shadow = nullptr;    // canaries' answers compared (may be null)
  EngineProgress* progress = nullptr;  // whether streams still move, by engine (may be null)
  const EngineKeySource* engine_key = nullptr;  // the key every attempt carries (may be null)
};

class RelayedRequest : public std::enable_shared_from_this<RelayedRequest> {
 public:
  RelayedRequest(boost::asio::any_io_executor strand, std::string route,
                 std::shared_ptr<HttpExchange> exchange, RelayDeps deps);
  // Begins (posts to the strand).
  void Start();

 private:
  enum class Mode { kNone, kStream, kBuffer, kRefused, kErrorInStream };

  void Admit(std::optional<Target> failed);
  void OnGrant(Result<Target> target);
  void StartAttempt();
  // Hears, for the current attempt, that its node left the fleet: cuts it (replayed).
  void WatchTarget();
  void OnHead(int status, const std::string& content_type, bool streaming);
  void OnData(std::string_view bytes);
  // One whole SSE event of a stream to the client; false when it failed the attempt.
  bool RelayEvent(const std::string& event);
  // The continuation's first new token after a failure: the failover's gap, measured.
  void ObserveContinued();
  void OnEnd(UpstreamError error, const std::string& message);
  void OnStreamEnd(UpstreamError error, const std::string& message);
  void EndBuffered();
  enum class AttemptEnd { kSucceeded, kFailed, kEnded };
  // `kind` labels it in baton_router_upstream_errors_total (default: the error's name);
  // `counted` is what it counts against its engine.
  void AttemptFailed(UpstreamError error, const std::string& message, const char* kind = nullptr,
                     AttemptEnd counted = AttemptEnd::kFailed);
  void GiveUp(int status, const std::string& kind, const std::string& message);
  // Counts the current attempt's end against its engine; call before ReleaseTarget().
  void CountAttempt(AttemptEnd end);
  // The canary's engine id when the current attempt, a success, is to be compared with the
  // primary (ShadowComparer::Sample()); call before ReleaseTarget().
  std::optional<uint64_t> ShadowCanary();
  // After the client's answer: compares `canary_ids` (none: the answer had no token ids).
  void StartShadow(uint64_t canary, std::optional<std::vector<int32_t>> canary_ids);
  void ReleaseTarget();
  // A canary's 4xx: the request goes to another engine, the canary's count waits for that
  // engine's answer. Not an engine failure: the canary is not marked unreachable, and no
  // replay or upstream error is counted.
  void RetryCanaryRefusal();
  // Counts the canary's 4xx (refused_by_canary_) as failed when the attempt after it
  // succeeded with a 2xx, else (or for a 408 or 429: busy, not wrong) as ended.
  void SettleCanaryRefusal(bool answered_2xx);
  // Records the request's end in the metrics; called before the client's last bytes go out,
  // so that whoever reads /metrics once it has its answer finds the request counted.
  void Finish(int status, const std::string& upstream_error);

  boost::asio::any_io_executor strand_;
  const std::string route_;
  std::shared_ptr<HttpExchange> exchange_;
  RelayDeps deps_;
  StreamReplay replay_;
  const TimePoint arrival_;
  TimePoint attempt_started_;  // the current attempt's start: its engine's latency counts from here
  TimePoint queued_at_;
  std::optional<uint64_t> waiting_ticket_;  // while in the admission queue
  std::optional<Target> target_;
  uint64_t loss_watch_ = 0;   // Admitter::WatchLoss() of target_, 0 when none
  bool target_lost_ = false;  // the current attempt was cut because its node left
  std::string shadow_node_;   // the node of the canary ShadowCanary() chose
  std::shared_ptr<UpstreamCall> call_;
  Mode mode_ = Mode::kNone;
  int status_ = 0;
  std::string content_type_;
  std::string body_;
  SseSplitter splitter_;
  std::string stream_broken_;  // why the engine's stream is broken (a server_error event, ...)
  bool done_seen_ = false;
  bool body_too_large_ = false;  // a buffered response past kMaxBufferedBody
  bool client_header_sent_ = false;
  bool client_gone_ = false;
  // The client left once its stream was whole (it closes as soon as it reads [DONE]): the
  // request succeeded, it is no 499.
  bool gone_when_whole_ = false;
  bool finished_ = false;
  bool first_token_seen_ = false;
  int migrations_ = 0;
  uint64_t progress_id_ = 0;  // the current attempt's stream in EngineProgress, 0 when none
  std::optional<TimePoint> unreachable_since_;  // first of the current run of refusals
  // When an attempt that had sent tokens failed, until the continuation's next token.
  std::optional<TimePoint> failed_at_;
  // A canary that answered 4xx (refused_status_), judged by the next attempt's answer
  // (SettleCanaryRefusal).
  std::optional<Target> refused_by_canary_;
  int refused_status_ = 0;
};

}  // namespace baton
