#include "router/upstream/upstream_call.h"

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/post.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <limits>
#include <optional>
#include <utility>

#include "router/router_options.h"

namespace baton {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

// What the read buffer may hold of a response not yet parsed: the header (Beast's default
// limit for responses, 8 KiB) and a read, with room to spare. Body bytes leave it as parsed.
constexpr size_t kMaxUnparsedBytes = 256 * 1024;

class Call : public UpstreamCall, public std::enable_shared_from_this<Call> {
 public:
  Call(asio::any_io_executor ex, std::string address, UpstreamRequest request,
       UpstreamTimeouts timeouts, UpstreamSink sink, UpstreamPool* pool)
      : ex_(std::move(ex)),
        address_(std::move(address)),
        request_(std::move(request)),
        timeouts_(timeouts),
        sink_(std::move(sink)),
        pool_(pool) {}

  void Start() {
    std::string host;
    uint16_t port = 0;
    boost::system::error_code ec;
    asio::ip::address ip;
    if (SplitHostPort(address_, "backend", &host, &port).ok()) {
      ip = asio::ip::make_address(host, ec);
    } else {
      ec = asio::error::invalid_argument;
    }
    auto self = shared_from_this();
    if (ec) {
      asio::post(ex_, [self] {
        self->End(UpstreamError::kConnect,
                  "the engine address is not HOST:PORT: " + self->address_);
      });
      return;
    }
    endpoint_ = tcp::endpoint(ip, port);
    if (pool_ != nullptr) stream_ = pool_->Take(address_);
    reused_ = stream_ != nullptr;
    if (reused_) {
      asio::post(ex_, [self] { self->SendRequest(); });
    } else {
      Connect();
    }
  }

  void Cancel() override {
    if (ended_) return;
    cancelled_ = true;
    beast::error_code ignored;
    if (stream_) stream_->socket().close(ignored);
  }

 private:
  template <class Handler>
  auto Bound(Handler h) {
    return asio::bind_executor(ex_, std::move(h));
  }

  void Connect() {
    stream_ = std::make_unique<beast::tcp_stream>(ex_);
    stream_->expires_after(timeouts_.connect);
    stream_->async_connect(
        endpoint_, Bound([self = shared_from_this()](beast::error_code ec) {
          // An address that refuses connections has no engine: its idle ones lead nowhere.
          if (ec && !self->cancelled_ && self->pool_ != nullptr)
            self->pool_->Forget(self->address_);
          if (ec && self->silent_retry_of_.has_value() && !self->cancelled_) {
            // The pooled connection broke and the engine is not there any more: it may have
            // had the request (it crashed on it), so this is the broken attempt, not a refusal.
            return self->End(self->silent_retry_of_->first,
                             self->silent_retry_of_->second + "; reconnecting: " + ec.message());
          }
          if (ec) {
            return self->End(self->cancelled_ ? UpstreamError::kCancelled : UpstreamError::kConnect,
                             "cannot connect to the engine: " + ec.message());
          }
          beast::error_code ignored;  // the request goes out in one write; no waiting on acks
          self->stream_->socket().set_option(tcp::no_delay(true), ignored);
          self->SendRequest();
        }));
  }

  void SendRequest() {
    if (cancelled_) return End(UpstreamError::kCancelled, "cancelled");
    req_ = {};
    req_.method(request_.method);
    req_.target(request_.target);
    req_.version(11);
    req_.keep_alive(pool_ != nullptr);
    req_.set(http::field::host, "baton-engine");
    if (!request_.content_type.empty()) req_.set(http::field::content_type, request_.content_type);
    if (!request_.accept.empty()) req_.set(http::field::accept, request_.accept);
    if (!request_.authorization.empty())
      req_.set(http::field::authorization, request_.authorization);
    req_.body() = request_.body;
    req_.prepare_payload();
    stream_->expires_after(timeouts_.first_byte);
    http::async_write(*stream_, req_,
                      Bound([self = shared_from_this()](beast::error_code ec, size_t) {
                        if (ec)
                          return self->Fail(ec, UpstreamError::kBroken, "engine write failed");
                        self->ReadHeader();
                      }));
  }

  void ReadHeader() {
    parser_.emplace();
    parser_->body_limit(std::numeric_limits<std::uint64_t>::max());
    http::async_read_header(
        *stream_, buffer_, *parser_,
        Bound([self = shared_from_this()](beast::error_code ec, size_t) { self->OnHeader(ec); }));
  }

  void OnHeader(beast::error_code ec) {
    if (ec == beast::error::timeout) {
      return End(UpstreamError::kFirstByteTimeout, "the engine did not answer in time");
    }
    if (ec) return Fail(ec, UpstreamError::kBroken, "the engine's response broke");
    reused_ = false;  // the response has begun: no silent retry from here on
    const unsigned status = parser_->get().result_int();
    if (status == 101) return End(UpstreamError::kBroken, "the engine switched protocols");
    // An interim response (103 Early Hints, an unasked 100): the final one follows on the same
    // connection (RFC 9110 section 15.2), within the same first-byte deadline.
    if (status >= 100 && status < 200) return ReadHeader();
    const auto& head = parser_->get();
    const std::string content_type(head[http::field::content_type]);
    // Only the media type says stream: engines and proxies chunk plain JSON bodies too.
    const bool streaming = content_type.rfind("text/event-stream", 0) == 0;
    if (sink_.on_head) sink_.on_head(head.result_int(), content_type, streaming);
    ReadBody();
  }

  void ReadBody() {
    if (ended_) return;
    // After Cancel() the parser could still complete from bytes already buffered: stop here.
    if (cancelled_) return End(UpstreamError::kCancelled, "cancelled");
    if (parser_->is_done()) return End(UpstreamError::kNone, "");
    parser_->get().body().data = chunk_;
    parser_->get().body().size = sizeof(chunk_);
    stream_->expires_after(timeouts_.idle);
    http::async_read_some(
        *stream_, buffer_, *parser_,
        Bound([self = shared_from_this()](beast::error_code ec, size_t) { self->OnBody(ec); }));
  }

  void OnBody(beast::error_code ec) {
    if (ec == http::error::need_buffer) ec = {};
    const size_t n = sizeof(chunk_) - parser_->get().body().size;
    if (n > 0 && !ended_ && sink_.on_data) sink_.on_data(std::string_view(chunk_, n));
    if (ec == beast::error::timeout) {
      return End(UpstreamError::kIdleTimeout, "the engine's stream stalled");
    }
    if (ec) return Fail(ec, UpstreamError::kBroken, "the engine's response broke");
    ReadBody();
  }

  void Fail(beast::error_code ec, UpstreamError kind, const std::string& what) {
    if (reused_ && !cancelled_) {
      // A pooled connection the engine had closed: once more on a fresh one.
      reused_ = false;
      silent_retry_of_.emplace(kind, what + ": " + ec.message());
      buffer_.clear();
      beast::error_code ignored;
      stream_->socket().close(ignored);
      return Connect();
    }
    End(cancelled_ ? UpstreamError::kCancelled : kind, what + ": " + ec.message());
  }

  void End(UpstreamError error, const std::string& message) {
    if (ended_) return;
    ended_ = true;
    const bool reusable = error == UpstreamError::kNone && pool_ != nullptr && parser_ &&
                          parser_->is_done() && parser_->get().result_int() >= 200 &&
                          parser_->keep_alive() && buffer_.size() == 0;
    if (reusable) {
      pool_->Put(address_, std::move(stream_));
    } else if (stream_) {
      beast::error_code ignored;
      stream_->socket().shutdown(tcp::socket::shutdown_both, ignored);
      stream_->socket().close(ignored);
    }
    if (sink_.on_end) sink_.on_end(error, message);
    sink_ = {};
  }

  asio::any_io_executor ex_;
  const std::string address_;
  tcp::endpoint endpoint_;
  UpstreamRequest request_;
  UpstreamTimeouts timeouts_;
  UpstreamSink sink_;
  UpstreamPool* pool_;
  std::unique_ptr<beast::tcp_stream> stream_;
  http::request<http::string_body> req_;
  std::optional<http::response_parser<http::buffer_body>> parser_;
  // Bounded: an engine's endless chunk-size line or trailers must not grow the router.
  beast::flat_buffer buffer_{kMaxUnparsedBytes};
  char chunk_[16384];
  bool reused_ = false;  // stream_ came from the pool and no response byte has arrived
  // Set when a pooled connection broke and the call reconnects silently: the error it broke
  // with, reported if the reconnection fails.
  std::optional<std::pair<UpstreamError, std::string>> silent_retry_of_;
  bool ended_ = false;
  bool cancelled_ = false;
};

}  // namespace

const char* UpstreamErrorName(UpstreamError e) {
  switch (e) {
    case UpstreamError::kNone:
      return "none";
    case UpstreamError::kConnect:
      return "connect";
    case UpstreamError::kFirstByteTimeout:
      return "first_byte_timeout";
    case UpstreamError::kIdleTimeout:
      return "idle_timeout";
    case UpstreamError::kBroken:
      return "broken";
    case UpstreamError::kCancelled:
      return "cancelled";
  }
  return "unknown";
}

std::shared_ptr<UpstreamCall> StartUpstreamCall(asio::any_io_executor executor,
                                                const std::string& address, UpstreamRequest request,
                                                UpstreamTimeouts timeouts, UpstreamSink sink,
                                                UpstreamPool* pool) {
  auto call = std::make_shared<Call>(std::move(executor), address, std::move(request), timeouts,
                                     std::move(sink), pool);
  call->Start();
  return call;
}

}  // namespace baton
