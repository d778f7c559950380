#include "router/canary/shadow_comparer.h"

#include <boost/asio/strand.hpp>
#include <memory>
#include <nlohmann/json.hpp>

#include "base/log.h"
#include "base/text/json_depth.h"

namespace baton {
namespace {

namespace http = boost::beast::http;
using Json = nlohmann::ordered_json;

constexpr size_t kMaxShadowBody = 64u << 20;  // as a relayed buffered answer

// `text` parsed, unless it nests deeper than kMaxJsonDepth; a discarded value otherwise.
Json ParseBounded(std::string_view text) {
  if (JsonNestingDepth(text) > kMaxJsonDepth) return Json(Json::value_t::discarded);
  return Json::parse(text, nullptr, /*allow_exceptions=*/false);
}

// The request's seed for a log line: "seed N", or "no seed, greedy".
std::string SeedText(std::string_view request) {
  const Json j = ParseBounded(request);
  auto seed = j.is_object() ? j.find("seed") : j.end();
  if (!j.is_object() || seed == j.end() || !seed->is_number_integer()) return "no seed, greedy";
  return "seed " + seed->dump();
}

}  // namespace

// One shadow: the call to the primary, its answer buffered, then Finish() on the comparer.
class ShadowComparer::Call : public std::enable_shared_from_this<ShadowComparer::Call> {
 public:
  Call(ShadowComparer* owner, CanaryAnswer answer) : owner_(owner), answer_(std::move(answer)) {}

  void Start(const Target& primary, std::string body) {
    UpstreamRequest req{.method = http::verb::post,
                        .target = answer_.route,
                        .body = std::move(body),
                        .content_type = "application/json",
                        .accept = "application/json"};
    if (owner_->engine_key_ != nullptr) req.authorization = owner_->engine_key_->Header();
    auto self = shared_from_this();
    UpstreamSink sink{
        .on_head = [self](int status, const std::string&,
                          bool streaming) { self->OnHead(status, streaming); },
        .on_data = [self](std::string_view bytes) { self->OnData(bytes); },
        .on_end = [self](UpstreamError e, const std::string& m) { self->OnEnd(e, m); }};
    call_ = StartUpstreamCall(boost::asio::make_strand(owner_->executor_), primary.address,
                              std::move(req), owner_->timeouts_, std::move(sink), owner_->pool_);
  }

 private:
  void OnHead(int status, bool streaming) {
    status_ = status;
    streaming_ = streaming;
  }
  void OnData(std::string_view bytes) {
    if (too_large_) return;
    if (body_.size() + bytes.size() > kMaxShadowBody) {
      too_large_ = true;
      body_.clear();
      if (call_) call_->Cancel();
      return;
    }
    body_.append(bytes);
  }
  void OnEnd(UpstreamError error, const std::string& message) {
    call_.reset();
    owner_->Finish(answer_, Ids(error, message));
  }
  Result<std::vector<int32_t>> Ids(UpstreamError error, const std::string& message) const {
    if (error != UpstreamError::kNone) {
      return Unavailable(std::string(UpstreamErrorName(error)) + ": " + message);
    }
    if (too_large_) return Unavailable("an answer over 64 MiB");
    if (status_ != 200 || streaming_) {
      return Unavailable("the primary answered " + std::to_string(status_) +
                         (streaming_ ? " with a stream" : ""));
    }
    std::optional<std::vector<int32_t>> ids = AnswerTokenIds(body_);
    if (!ids) return Unavailable("the primary's answer has no token ids");
    return *std::move(ids);
  }

  ShadowComparer* const owner_;
  const CanaryAnswer answer_;
  std::shared_ptr<UpstreamCall> call_;
  int status_ = 0;
  bool streaming_ = false;
  bool too_large_ = false;
  std::string body_;
};

ShadowComparer::ShadowComparer(boost::asio::any_io_executor executor, int every,
                               UpstreamTimeouts timeouts, const Admitter* admission,
                               EngineOutcomes* outcomes, UpstreamPool* pool,
                               const EngineKeySource* engine_key)
    : executor_(std::move(executor)),
      every_(every),
      timeouts_(timeouts),
      admission_(admission),
      outcomes_(outcomes),
      pool_(pool),
      engine_key_(engine_key) {}

bool ShadowComparer::Sample() {
  if (every_ <= 0) return false;
  return sampled_.fetch_add(1) % static_cast<uint64_t>(every_) == 0;
}

bool ShadowComparer::TakeSlot() {
  size_t n = in_flight_.load();
  do {
    if (n >= kMaxInFlight) return false;
  } while (!in_flight_.compare_exchange_weak(n, n + 1));
  return true;
}

void ShadowComparer::Start(CanaryAnswer answer) {
  const std::optional<Target> primary =
      admission_->PrimaryFor({.engine_id = answer.engine_id, .node = answer.node});
  if (!primary || primary->engine_id == answer.engine_id) {
    ++failed_;
    BATON_LOG(DEBUG, "router") << "shadow of engine " << answer.engine_id
                               << ": no other ready primary, nothing compared";
    return;
  }
  std::optional<std::string> body = ShadowBody(answer.body);
  if (!body) {
    ++failed_;
    return;
  }
  if (!TakeSlot()) {
    ++busy_;
    BATON_LOG(DEBUG, "router") << "shadow of engine " << answer.engine_id
                               << " skipped: " << kMaxInFlight << " shadows already running";
    return;
  }
  ++started_;
  if (outcomes_ != nullptr) outcomes_->Hold(answer.node, answer.engine_id);
  std::make_shared<Call>(this, std::move(answer))->Start(*primary, std::move(*body));
}

void ShadowComparer::Finish(const CanaryAnswer& answer,
                            const Result<std::vector<int32_t>>& primary_ids) {
  if (!primary_ids.ok()) {
    ++failed_;
    BATON_LOG(DEBUG, "router") << "shadow of engine " << answer.engine_id
                               << " failed, nothing compared: " << primary_ids.status().message();
  } else {
    const std::optional<size_t> diff = FirstDifference(answer.token_ids, *primary_ids);
    if (outcomes_ != nullptr)
      outcomes_->RecordComparison(answer.node, answer.engine_id, !diff.has_value());
    ++compared_;
    if (diff) {
      ++disagreed_;
      BATON_LOG(INFO, "router") << "canary engine " << answer.engine_id
                                << " disagrees with the primary on " << answer.route << " ("
                                << SeedText(answer.body) << "): token ids differ at position "
                                << *diff << " (canary " << answer.token_ids.size()
                                << " ids, primary " << primary_ids->size() << ")";
    }
  }
  if (outcomes_ != nullptr) outcomes_->Release(answer.node, answer.engine_id);
  --in_flight_;
}

ShadowStats ShadowComparer::stats() const {
  return {.started = started_.load(),
          .busy = busy_.load(),
          .failed = failed_.load(),
          .compared = compared_.load(),
          .disagreed = disagreed_.load()};
}

std::optional<std::vector<int32_t>> AnswerTokenIds(std::string_view body) {
  const Json j = ParseBounded(body);
  if (!j.is_object()) return std::nullopt;
  auto choices = j.find("choices");
  if (choices == j.end() || !choices->is_array() || choices->size() != 1) return std::nullopt;
  const Json& c = (*choices)[0];
  auto ids = c.is_object() ? c.find("token_ids") : c.end();
  if (!c.is_object() || ids == c.end() || !ids->is_array()) return std::nullopt;
  std::vector<int32_t> out;
  out.reserve(ids->size());
  for (const Json& v : *ids) {
    if (!v.is_number_integer()) return std::nullopt;
    out.push_back(v.get<int32_t>());
  }
  return out;
}

std::optional<std::string> ShadowBody(std::string_view request) {
  Json j = ParseBounded(request);
  if (!j.is_object()) return std::nullopt;
  j["stream"] = false;
  j["return_token_ids"] = true;
  j.erase("stream_options");
  // A shadow must never claim the KV cache of a request (the client's body may name a key),
  // nor pass a client's resume count on.
  j.erase("baton_request_key");
  j.erase("baton_resume_tokens");
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::optional<size_t> FirstDifference(const std::vector<int32_t>& a,
                                      const std::vector<int32_t>& b) {
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    if (a[i] != b[i]) return i;
  }
  if (a.size() != b.size()) return n;
  return std::nullopt;
}

}  // namespace baton
